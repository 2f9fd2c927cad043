package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// denoEscapeGuest tries, from a requester's userData, every way to the bidder's host a deno
// guest had: dynamic imports of host JSON and JS files (literal specifiers), reads, a write
// outside its dir, a subprocess, FFI, the host's environment and a loopback port of the host.
// One line per attempt: "ATTEMPT <name> ok <what>" or "ATTEMPT <name> refused <error>".
const denoEscapeGuest = `
async function attempt(name, f) {
  try { console.log("ATTEMPT " + name + " ok " + JSON.stringify(await f())); }
  catch (e) { console.log("ATTEMPT " + name + " refused " + e.name + ": " + e.message); }
}
await attempt("import-json", async () => (await import(%[1]q, { with: { type: "json" } })).default);
await attempt("import-js", async () => (await import(%[2]q)).marker);
await attempt("read", () => Deno.readTextFile(%[1]q));
await attempt("write", () => Deno.writeTextFile(%[3]q, "x"));
await attempt("command", async () => (await new Deno.Command("/bin/cat", { args: [%[1]q] }).output()).code);
await attempt("dlopen", () => Deno.dlopen("/lib/x86_64-linux-gnu/libc.so.6", { getpid: { parameters: [], result: "i32" } }).symbols.getpid());
await attempt("env", () => Deno.env.get(%[4]q));
await attempt("connect", async () => { const c = await Deno.connect({ hostname: "127.0.0.1", port: %[5]d }); c.close(); return "connected"; });
console.log("ATTEMPTS DONE");
`

// hostFiles writes a marker into a JSON file and a JS module in a temp dir of the host
// (outside the bidder's state dir and the data dir), as a provider's account.json would be.
func hostFiles(t *testing.T) (dir, marker string) {
	t.Helper()
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	marker = "host-marker-" + hex.EncodeToString(b)
	dir = t.TempDir()
	for name, body := range map[string]string{
		"account.json": fmt.Sprintf(`{"password": %q}`, marker),
		"module.js":    fmt.Sprintf(`export const marker = %q;`, marker),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, marker
}

// keptSubstrate keeps the status and log of each guest its bidder removes (a bidder removes
// a guest that ended by itself once it has reported it), for the row to read afterwards.
type keptSubstrate struct {
	substrate.Substrate
	mu   sync.Mutex
	kept map[string]keptGuest
}

type keptGuest struct {
	st   substrate.GuestStatus
	logs string
}

func (k *keptSubstrate) Remove(ctx context.Context, id string) error {
	st, err := k.Substrate.Status(ctx, id)
	if err == nil {
		logs, _ := k.Substrate.Logs(ctx, id, 0)
		k.mu.Lock()
		k.kept[id] = keptGuest{st, string(logs)}
		k.mu.Unlock()
	}
	return k.Substrate.Remove(ctx, id)
}

// jailBidder starts a bidder whose deno substrate keeps what its removed guests left.
func jailBidder(t *testing.T, env *testenv.Env) (*runningBidder, *keptSubstrate) {
	t.Helper()
	const handle = "jailbidder.test"
	if _, err := env.PDS.CreateAccount(context.Background(), handle, "pw-"+handle); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "guests")
	sub, err := deno.New(deno.Config{StateDir: dir})
	if err != nil {
		substratetest.Require(t, false, "deno substrate: "+err.Error(), "bash hack/install-deno.sh; run as root")
	}
	k := &keptSubstrate{Substrate: sub, kept: map[string]keptGuest{}}
	substratetest.Cleanup(t, sub, dir)
	return runBidderOn(t, env, handle, 5, k, dir), k
}

// endedGuest waits until the contract is released after its guest ended by itself and
// returns what the guest left: its last status and its whole log.
func endedGuest(t *testing.T, env *testenv.Env, b *runningBidder, k *keptSubstrate, name string) (substrate.GuestStatus, string) {
	t.Helper()
	c := waitContract(t, env, name, v1alpha1.ComputeContractReleased)
	if c.Status.Winner != b.DID() || c.Status.Accept == "" {
		t.Fatalf("contract %s: %+v", name, c.Status)
	}
	id := bidder.GuestID(c.Status.Accept)
	var g keptGuest
	testenv.Eventually(t, 10*time.Second, "guest "+id+" removed", func() (bool, error) {
		k.mu.Lock()
		defer k.mu.Unlock()
		var ok bool
		g, ok = k.kept[id]
		return ok, nil
	})
	return g.st, g.logs
}

// A requester's deno guest, won through the market, reaches nothing of the bidder's host:
// static imports of a host JSON file and a host JS module fail the program; the dynamic
// imports, the read, the write, the subprocess, FFI, the environment and the loopback
// connect are each refused; the marker never appears in the guest's output and its write
// does not land.
func TestSEC_DenoGuestReachesNothingOfTheHost(t *testing.T) {
	env := marketEnv(t)
	b, k := jailBidder(t, env)
	dir, marker := hostFiles(t)
	const hostVar = "SOCIALWEB_E2E_HOST_SECRET"
	t.Setenv(hostVar, marker)
	port, accepted := substratetest.Listener(t)
	written := filepath.Join(dir, "written-by-guest")
	guests := map[string]string{
		"static-json": fmt.Sprintf(`import x from %q with { type: "json" }; console.log("GOT " + JSON.stringify(x));`, filepath.Join(dir, "account.json")),
		"static-js":   fmt.Sprintf(`import { marker } from %q; console.log("GOT " + marker);`, filepath.Join(dir, "module.js")),
		"dynamic": fmt.Sprintf(denoEscapeGuest, filepath.Join(dir, "account.json"), filepath.Join(dir, "module.js"), written, hostVar,
			port),
	}
	for name, prog := range guests {
		newContract(t, env, name, func(c *v1alpha1.ComputeContract) { c.Spec.UserData = prog })
	}
	for name := range guests {
		st, logs := endedGuest(t, env, b, k, name)
		if strings.Contains(logs, marker) || strings.Contains(logs, "GOT ") {
			t.Errorf("%s: the host's marker reached the guest:\n%s", name, logs)
		}
		if name != "dynamic" {
			if st.Phase != substrate.Exited || st.ExitCode == 0 {
				t.Errorf("%s: %+v, want the program to fail\n%s", name, st, logs)
			}
			continue
		}
		if !strings.Contains(logs, "ATTEMPTS DONE") {
			t.Fatalf("the guest did not get through its attempts: %+v\n%s", st, logs)
		}
		for _, a := range []string{"import-json", "import-js", "read", "write", "command", "dlopen", "env", "connect"} {
			if !strings.Contains(logs, "ATTEMPT "+a+" refused ") {
				t.Errorf("attempt %s was not refused:\n%s", a, logs)
			}
		}
	}
	if _, err := os.Stat(written); err == nil {
		t.Error("the guest wrote a file on the host")
	}
	select {
	case <-accepted:
		t.Error("the guest connected to a host loopback port")
	default:
	}
	waitNoProcs(t, b.stateDir)
}

// A guest that allocates past its contract's memory (256 MiB, outside the V8 heap, which
// Deno's own flag does not bound) is killed by its cgroup; the contract ends and the bidder
// wins and runs the next contract as before.
func TestSEC_DenoGuestPastItsMemoryIsKilled(t *testing.T) {
	env := marketEnv(t)
	b, k := jailBidder(t, env)
	newContract(t, env, "hog", func(c *v1alpha1.ComputeContract) {
		c.Spec.UserData = `
const keep = [];
for (let i = 1; ; i++) { const b = new Uint8Array(16 << 20); b.fill(1); keep.push(b); console.log("allocated " + i * 16 + " MiB"); }`
	})
	st, logs := endedGuest(t, env, b, k, "hog")
	if st.Phase != substrate.Exited || st.ExitCode != 137 || !strings.Contains(st.Message, "memory limit") {
		t.Fatalf("hog: %+v\n%s", st, logs)
	}
	if strings.Contains(logs, "allocated 512 MiB") {
		t.Fatalf("the guest got far past its limit:\n%s", logs)
	}
	newContract(t, env, "after")
	waitContract(t, env, "after", v1alpha1.ComputeContractHeld)
	release(t, env, "after")
	waitContract(t, env, "after", v1alpha1.ComputeContractReleased)
	waitNoProcs(t, b.stateDir)
}
