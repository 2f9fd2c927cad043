#!/usr/bin/env bash
# Regenerates internal/pds/stdlex (the standard lexicons the embedded PDS validates records
# against) from the reference PDS pinned in test/peers/atproto-pds and the indigo module in
# go.mod. Installs the reference into .cache/refpds if needed (as the interop tests do).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
work=.cache/refpds
bash test/peers/atproto-pds/run.sh "$work" install
node="$root/$work/node22/node_modules/.bin/node"
refdir="$root/$work/pds"
ref_version=$("$node" -p "require('$refdir/node_modules/@atproto/pds/package.json').version")
records=$(mktemp)
trap 'rm -f "$records"' EXIT
(cd "$refdir" && "$node" --input-type=module -e "$(cat "$root/hack/stdlex/records.mjs")") >"$records"
indigo_dir=$(go list -m -f '{{.Dir}}' github.com/bluesky-social/indigo)
indigo_version=$(go list -m -f '{{.Version}}' github.com/bluesky-social/indigo)
go run ./hack/stdlex -indigo "$indigo_dir" -indigo-version "$indigo_version" \
  -records "$records" -ref-version "$ref_version" -extra hack/stdlex/extra -out internal/pds/stdlex
echo "stdlex: $(sed -n 4p internal/pds/stdlex/SOURCE)"
