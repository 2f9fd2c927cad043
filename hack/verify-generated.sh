#!/usr/bin/env bash
# Fails when the generated files under api/ and config/ are out of date with
# their markers: the deepcopy code and the CRDs with those in api/, the RBAC
# roles (config/rbac/role.yaml) with the +kubebuilder:rbac markers on the
# reconcilers. Regenerates them in the work tree (deleting the generated YAML
# first, so a stale file of a renamed or removed kind shows up as a deletion)
# and checks git sees no change and no new file.
set -euo pipefail

cd "$(git rev-parse --show-toplevel)"

rm -f config/crd/bases/socialweb.computer_*.yaml config/rbac/role.yaml
go generate ./api/... ./config/rbac/...

status=0
if ! git diff --exit-code --stat -- api config; then
	echo "verify-generated: generated files differ from the committed ones; run 'go generate ./api/... ./config/rbac/...' and commit." >&2
	status=1
fi
untracked=$(git ls-files --others --exclude-standard -- api config)
if [[ -n "$untracked" ]]; then
	echo "verify-generated: generation produced files git does not track:" >&2
	echo "$untracked" >&2
	status=1
fi
if [[ $status -eq 0 ]]; then
	echo "verify-generated: up to date"
fi
exit $status
