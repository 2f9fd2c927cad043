#!/usr/bin/env bash
# Installs what the tests need on a fresh machine of this project's kind (Debian, Go, Node,
# npm and kubectl come with it): curl for the reference PDS harness, iproute2 for the network
# namespace and veth pair the tenant apiservers advertise (the tenant rows run as root), Deno
# (from npm, into .cache/deno) for the guests, netcat-openbsd and bind9-dnsutils for the
# conformance images' userland (hack/conformance, docs/conformance.md), chromium for the
# console rows (a headless browser driven by chromedp, docs/console.md). Idempotent.
set -euo pipefail
missing=()
command -v curl >/dev/null || missing+=(curl)
command -v npm >/dev/null || missing+=(npm)
command -v ip >/dev/null || missing+=(iproute2)
[ -x /bin/nc.openbsd ] || missing+=(netcat-openbsd)
command -v dig >/dev/null || missing+=(bind9-dnsutils)
command -v chromium >/dev/null || missing+=(chromium)
# libseccomp.a: the node runtime's runc is linked statically with it (hack/build-node-runtime.sh).
[ -e /usr/include/seccomp.h ] || missing+=(libseccomp-dev)
if [ ${#missing[@]} -gt 0 ]; then
	echo "== installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Guests: qemu and busybox for the vm substrate, containerd, runc and the CNI plugins for
# the node substrate, Deno (pinned, from npm) for the deno one.
bash "$here/install-guest-deps.sh"
bash "$here/install-deno.sh" >/dev/null
# The reference PDS (Node 22 and @atproto/pds from npm) for the interop rows, into .cache/.
echo "== reference PDS (installed once into .cache/refpds)"
bash "$here/../test/peers/atproto-pds/run.sh" "$here/../.cache/refpds" install
command -v kubectl >/dev/null || { echo "kubectl is not installed; the kubectl rows need it" >&2; exit 1; }
