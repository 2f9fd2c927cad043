#!/usr/bin/env bash
# Builds the one socialweb binary with the Kubernetes version stamped in (hack/kube-ldflags.sh).
# Usage: hack/build.sh [OUTPUT]   (default bin/socialweb)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bin/socialweb}
go build -ldflags "$(bash hack/kube-ldflags.sh)" -o "$out" ./cmd/socialweb
