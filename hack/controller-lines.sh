#!/usr/bin/env bash
# Counts the lines of status, finalizer and conflict handling the controllers under
# internal/controllers (or DIR) write by hand, one row per pattern, so a change to how they
# reconcile shows its size. Tests and reconcilekit itself are left out of the rows; the last
# row counts the calls of reconcilekit that took their place.
# Usage: hack/controller-lines.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-internal/controllers}
count() { # label, extended regexp
	local n
	n=$( (grep -rhE --include='*.go' --exclude='*_test.go' --exclude-dir=reconcilekit "$2" "$dir" || true) | wc -l)
	printf '%-32s %4d\n' "$1" "$n"
}
count 'status Update/Patch' 'Status\(\)\.(Update|Patch)\('
count 'finalizer add/remove' 'controllerutil\.(AddFinalizer|RemoveFinalizer)\('
count 'RetryOnConflict' 'RetryOnConflict\('
count 'IsConflict' 'IsConflict\('
count 'hand-written retry loops' 'for (try|attempt) := 0; ; '
count 'Result{Requeue: (deprecated)' 'Requeue:'
count 'MergeFrom without lock' 'client\.MergeFrom\('
count 'reconcilekit calls' 'reconcilekit\.'
