#!/usr/bin/env bash
# Builds the container image of socialweb without Docker or a registry: a static binary
# (CGO_ENABLED=0, since the image has no libc) in bin/image/socialweb, then the image
# (internal/ociimage, written by hack/image): that binary, the CA certificates of this host
# and a nonroot user (65532), for a read-only root filesystem, as an OCI image-layout tarball
# named socialweb.computer/socialweb:local. Same sources, same Go, same CAs: same digest.
# Usage: hack/image.sh [OUTPUT]   (default bin/socialweb-image.tar)
# Environment: GOARCH (default this host's), VERSION (default git describe),
# IMAGE_SOURCE (the org.opencontainers.image.source label), CA_BUNDLE.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bin/socialweb-image.tar}
arch=${GOARCH:-$(go env GOARCH)}
version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[ -s "$ca" ] || { echo "$ca is missing: apt-get install ca-certificates, or set CA_BUNDLE" >&2; exit 1; }
mkdir -p bin/image
CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath \
	-ldflags "$(bash hack/kube-ldflags.sh) -s -w -X socialweb.computer/internal/version.Version=$version" \
	-o bin/image/socialweb ./cmd/socialweb
# The writer runs on this host, whatever GOARCH the image is for.
env -u GOARCH -u GOOS go run ./hack/image --binary bin/image/socialweb --ca "$ca" --arch "$arch" \
	--version "$version" --source "${IMAGE_SOURCE:-}" --out "$out"
