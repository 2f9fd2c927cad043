#!/usr/bin/env bash
# Builds the one socialweb binary with the Kubernetes version stamped in (hack/kube-ldflags.sh).
# Usage: hack/build.sh [OUTPUT]   (default bin/socialweb)
# Builds the node runtime (containerd v2, runc) beside it too: OUTPUT's dir/node-runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bin/socialweb}
go build -ldflags "$(bash hack/kube-ldflags.sh)" -o "$out" ./cmd/socialweb
bash hack/build-node-runtime.sh "$(dirname "$out")/node-runtime"
