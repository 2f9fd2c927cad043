#!/usr/bin/env bash
# Builds the node runtime from source: containerd v2 (containerd, containerd-shim-runc-v2,
# ctr) and runc, at the versions hack/node-runtime/go.mod pins, into OUTDIR (default
# bin/node-runtime, next to bin/socialweb, where a node looks for them first).
# containerd is pure Go (its cgo parts, btrfs and the like, are left out by tags); runc needs
# cgo for seccomp and is linked statically against libseccomp (libseccomp-dev), so a node's
# root carries it without shared libraries.
set -euo pipefail
out=${1:-$(dirname "$0")/../bin/node-runtime}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/node-runtime"
ver() { go list -m -f '{{.Version}}' "$1"; }
ctrd=$(ver github.com/containerd/containerd/v2)
runc=$(ver github.com/opencontainers/runc)
ctags="no_btrfs no_devmapper no_zfs no_aufs no_dynamic_plugins"
cld="-s -w -X github.com/containerd/containerd/v2/version.Version=$ctrd -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
for cmd in containerd containerd-shim-runc-v2 ctr; do
	CGO_ENABLED=0 go build -trimpath -tags "$ctags" -ldflags "$cld" -o "$out/$cmd" "github.com/containerd/containerd/v2/cmd/$cmd"
done
[ -e /usr/lib/x86_64-linux-gnu/libseccomp.a ] || [ -n "$(find /usr/lib -name libseccomp.a -print -quit)" ] ||
	{ echo "libseccomp.a is missing: apt-get install libseccomp-dev (hack/install-test-deps.sh)" >&2; exit 1; }
CGO_ENABLED=1 go build -trimpath -buildmode=pie -tags "seccomp netgo osusergo urfave_cli_no_docs" \
	-ldflags "-s -w -X main.version=${runc#v} -linkmode external -extldflags -static-pie" \
	-o "$out/runc" github.com/opencontainers/runc
