#!/usr/bin/env bash
# Installs the pinned Deno (internal/denodist/npm/package.json + package-lock.json) from
# the npm registry into <repo>/.cache/deno and prints the path of the binary
# on stdout (everything else goes to stderr). The deno substrate uses this
# path by default. Idempotent: a present binary of the pinned version is kept.
# Install scripts are not run: the platform package already carries the binary.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="$root/.cache/deno"
want="$(sed -n 's/.*"deno": *"\([0-9.]*\)".*/\1/p' "$root/internal/denodist/npm/package.json")"

case "$(uname -m)" in
x86_64) plat=linux-x64-glibc ;;
aarch64) plat=linux-arm64-glibc ;;
*) echo "install-deno: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac
bin="$prefix/node_modules/@deno/$plat/deno"

if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | head -1 | grep -q "deno $want "; then
	echo "$bin"
	exit 0
fi

mkdir -p "$prefix"
cp "$root/internal/denodist/npm/package.json" "$root/internal/denodist/npm/package-lock.json" "$prefix/"
echo "install-deno: npm ci deno@$want into $prefix" >&2
npm ci --prefix "$prefix" --ignore-scripts --no-audit --no-fund --loglevel=error >&2
chmod +x "$bin"
"$bin" --version | head -1 >&2
echo "$bin"
