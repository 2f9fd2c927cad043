#!/usr/bin/env bash
# The project's test command: installs what the tests need, checks that generated code is
# current, and runs every test, the end-to-end rows and the interop rows against the
# reference PDS included. Safe to run again; installs are skipped when present.
#
# --extended also runs the rows too costly for every run: a Kubernetes node in a vm guest on
# a host without KVM, where qemu emulates the CPU (they run anyway where /dev/kvm is usable).
set -euo pipefail
cd "$(dirname "$0")/.."

timeout=45m
case "${1:-}" in
"") ;;
--extended)
	export SOCIALWEB_E2E_EXTENDED=1
	timeout=75m
	;;
*)
	echo "usage: bash hack/test.sh [--extended]" >&2
	exit 2
	;;
esac

# Each phase is announced with the time, so a slow run says where its time went.
phase() { echo "== $(date -u +%H:%M:%S) $*"; }

bash hack/install-test-deps.sh

phase "generated code is current"
bash hack/verify-generated.sh
bash hack/verify-lexgen.sh

phase "go vet"
go vet ./...

phase "staticcheck"
# A tool of the module (go.mod's tool block): the version is pinned and nothing is fetched
# beyond the module cache.
go tool staticcheck ./...

phase "build (once, for every package whose tests run the binary)"
bash hack/build.sh bin/socialweb
export SOCIALWEB_TEST_BIN="$PWD/bin/socialweb"

phase "tests"
# The interop rows start the reference PDS (Node 22 and @atproto/pds from npm, installed
# into .cache/ on first use); SOCIALWEB_INTEROP=1 runs them rather than skipping.
export SOCIALWEB_INTEROP=1
# Screenshots of the browser rows (the console) are kept here, one directory per row.
export SOCIALWEB_TEST_ARTIFACTS="$PWD/.cache/test-artifacts"
rm -rf "$SOCIALWEB_TEST_ARTIFACTS"
# gotestsum (a tool of the module) runs `go test` and prints what it prints; it also keeps the
# event stream, from which the slowest rows are listed whether or not the run passed.
mkdir -p .cache
rc=0
# The e2e package is the longest. Its rows that take more than a few seconds (a tenant
# cluster, a node, a market round) run in parallel, three at a time: they wait on kubelets,
# leases and timers as much as they compute, and each holds only state of its own (a data
# dir, ports, node address blocks under a host-wide lock; a fixture with fixed addresses
# holds substratetest.HostExclusive). More at once only slows each on a 2-core machine. The
# package is named first so that it starts first: go test runs packages in the order given
# (two at a time here), and ./... would leave it for last, after every other package. The
# timeout is a backstop for a hung row, not a budget.
go tool gotestsum --format standard-quiet --jsonfile .cache/test-events.json -- -count=1 -parallel 3 -timeout "$timeout" ./test/e2e ./... || rc=$?
phase "slowest tests (over 30s)"
go tool gotestsum tool slowest --jsonfile .cache/test-events.json --threshold 30s
[ "$rc" -eq 0 ] || exit "$rc"

phase "fuzz targets, briefly"
# Every FuzzXxx(f *testing.F) in the module's test files, found rather than listed, so that a
# new target runs here too. One line per target: package directory, then name.
targets=$(go list -f '{{$d := .Dir}}{{range .TestGoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .XTestGoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}' ./... |
	xargs -r awk -v root="$PWD" '/^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)/ {
		name = $2; sub(/\(.*/, "", name)
		dir = FILENAME; sub(/\/[^\/]*$/, "", dir)
		print "." substr(dir, length(root) + 1), name
	}' | sort -u)
if [ -z "$targets" ]; then
	echo "no fuzz targets found: the search above is broken" >&2
	exit 1
fi
while read -r pkg target; do
	go test -run '^$' -fuzz "^${target}\$" -fuzztime 20000x "$pkg"
done <<<"$targets"
