// Command socialweb-guest-jail is the init of a jailed deno guest (internal/substrate/jail),
// the same one `socialweb guest-jail CONFIG` runs, in a binary that links nothing else. The
// deno substrate starts it once per guest; beside the socialweb binary (hack/build.sh puts
// it there) it starts in about a millisecond where socialweb, whose Kubernetes packages run
// their initialisers first, takes tens. Without it, socialweb is its own init.
package main

import (
	"fmt"
	"os"

	"socialweb.computer/internal/substrate/jail"
)

func main() {
	jail.MaybeRun()
	fmt.Fprintf(os.Stderr, "usage: %s %s CONFIG\n(the init of a jailed deno guest, started by socialweb's deno substrate)\n", os.Args[0], jail.Command)
	os.Exit(2)
}
