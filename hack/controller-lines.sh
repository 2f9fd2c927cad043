#!/usr/bin/env bash
# Counts the lines of status, finalizer and conflict handling under internal/controllers
# (or DIR), one row per pattern, so a change to how controllers reconcile shows its size.
# Usage: hack/controller-lines.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-internal/controllers}
count() { # label, extended regexp
	local n
	n=$( (grep -rhE --include="*.go" "$2" "$dir" || true) | wc -l)
	printf '%-28s %4d\n' "$1" "$n"
}
count 'status Update/Patch' 'Status\(\)\.(Update|Patch)\('
count 'finalizer add/remove' 'controllerutil\.(AddFinalizer|RemoveFinalizer)\('
count 'RetryOnConflict' 'RetryOnConflict\('
count 'IsConflict' 'IsConflict\('
count 'Requeue: (deprecated)' 'Requeue:'
count '.Requeue read (deprecated)' '\.Requeue\b[^A]'
count 'MergeFrom without lock' 'client\.MergeFrom\('
count 'reconcilekit calls' 'reconcilekit\.'
