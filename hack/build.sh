#!/usr/bin/env bash
# Builds the one socialweb binary with the Kubernetes version stamped in (hack/kube-ldflags.sh).
# Usage: hack/build.sh [OUTPUT]   (default bin/socialweb)
# Builds beside it the deno guests' small jail init (socialweb-guest-jail: a guest starts about
# 80 ms sooner than with socialweb as its init), the nodes' CNI plugin that holds a pod until
# its NetworkPolicy rules are written (socialweb-cni-netpol) and the node runtime (containerd v2, runc):
# OUTPUT's dir/node-runtime.
# SOCIALWEB_BUILD_TAGS adds Go build tags (e.g. crashpoints: internal/crashpoint, for tests only).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bin/socialweb}
# Static (no cgo: only net and os/user would use it, and both have pure-Go paths): the
# same file runs on the host, in a node and as the container image's one binary.
CGO_ENABLED=0 go build -tags "${SOCIALWEB_BUILD_TAGS:-}" -ldflags "$(bash hack/kube-ldflags.sh)" -o "$out" ./cmd/socialweb
CGO_ENABLED=0 go build -o "$(dirname "$out")/socialweb-guest-jail" ./cmd/socialweb-guest-jail
CGO_ENABLED=0 go build -o "$(dirname "$out")/socialweb-cni-netpol" ./cmd/socialweb-cni-netpol
bash hack/build-node-runtime.sh "$(dirname "$out")/node-runtime"
