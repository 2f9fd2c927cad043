#!/usr/bin/env bash
# Installs what the tests need on a fresh machine of this project's kind (Debian, Go, Node,
# npm and kubectl come with it): curl for the reference PDS harness, Deno (from npm, into
# .cache/deno) for the market's guests. Idempotent.
set -euo pipefail
missing=()
command -v curl >/dev/null || missing+=(curl)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
	echo "== installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
command -v kubectl >/dev/null || { echo "kubectl is not installed; the kubectl rows need it" >&2; exit 1; }
bash "$(dirname "${BASH_SOURCE[0]}")/install-deno.sh" >/dev/null
