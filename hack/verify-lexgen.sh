#!/usr/bin/env bash
# Fails when the Go types under internal/atproto are not what go generate
# writes from lexicons/ (a lexicon changed without regenerating, or a
# generated file was edited by hand). CI runs it; so can you.
set -euo pipefail
cd "$(dirname "$0")/.."

go generate ./lexicons/...
go generate ./lexicons/... >/dev/null # a second run must change nothing either

if ! git diff --quiet -- internal/atproto; then
	echo "verify-lexgen: generated files differ from the committed ones:" >&2
	git --no-pager diff --stat -- internal/atproto >&2
	echo "verify-lexgen: run 'go generate ./lexicons/...' and commit the result" >&2
	exit 1
fi
untracked=$(git ls-files --others --exclude-standard -- internal/atproto)
if [ -n "$untracked" ]; then
	echo "verify-lexgen: generated files not committed:" >&2
	echo "$untracked" >&2
	exit 1
fi
echo "verify-lexgen: internal/atproto is up to date"
