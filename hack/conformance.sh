#!/usr/bin/env bash
# Runs the upstream Kubernetes conformance suite against a tenant cluster of `socialweb up`
# (docs/conformance.md): builds bin/socialweb, then e2e.test, ginkgo and the conformance
# images from the module's k8s.io/kubernetes (cached in .cache/conformance until go.mod
# changes), serves the images from a registry in a network namespace, starts up with a fresh
# data dir, creates a Cluster and prints "N passed, N failed, N skipped" and the time.
# Needs root (network namespaces, nodes). Not part of hack/test.sh: a full run is long.
# Usage: hack/conformance.sh [--focus RE] [--skip RE] [--procs N] [--dry-run] [--keep] ...
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${SOCIALWEB_CONFORMANCE_NO_BUILD:-}" != 1 ]]; then
	bash hack/build.sh bin/socialweb
fi
go build -o .cache/conformance/harness ./hack/conformance
exec .cache/conformance/harness "$@"
