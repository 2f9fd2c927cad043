#!/usr/bin/env bash
# Prints the -ldflags that stamp the Kubernetes version into the socialweb binary, so that
# the tenant control plane's /version and its components read e.g. v1.37.2 rather than
# v0.0.0-master. `go build` without them still works; only the reported version differs.
# Used by hack/build.sh and by the end-to-end harness (test/e2e).
set -euo pipefail
cd "$(dirname "$0")/.."
v=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)   # e.g. v1.37.2
core=${v#v}; major=${core%%.*}; rest=${core#*.}; minor=${rest%%.*}
flags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	flags+=" -X ${pkg}.gitVersion=${v} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
	flags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done
echo "${flags# }"
