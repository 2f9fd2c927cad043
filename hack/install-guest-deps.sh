#!/usr/bin/env bash
# Installs what the vm and node substrates and the vm image build need from
# Debian: qemu-system-x86 (the microVM), busybox-static (the guest's userland,
# also fetched by the image build and the busybox of the node substrate's
# local test image), containerd, runc and containernetworking-plugins (the
# node substrate's container runtime and its bridge/host-local CNI plugins in
# /usr/lib/cni), and the tools the image build calls (apt-get download,
# dpkg-deb, which ship with apt/dpkg), e2fsprogs (mkfs.ext4 writes the disks of
# nodes), iptables (the host refuses connections a node opens) and
# nftables (nft, which writes each node's NetworkPolicy rules). Idempotent: does nothing when
# everything is present; runs `apt-get update` at most once.
set -euo pipefail

pkgs=(qemu-system-x86 busybox-static containerd runc containernetworking-plugins e2fsprogs iptables nftables)
missing=()
for p in "${pkgs[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done

if ((${#missing[@]} == 0)); then
	echo "install-guest-deps: already installed: ${pkgs[*]}"
	exit 0
fi

SUDO=
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi

echo "install-guest-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
command -v qemu-system-x86_64 containerd runc
