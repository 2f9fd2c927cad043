package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/crashpoint"
	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// crashBin is a socialweb binary built with the crashpoints tag, so that SOCIALWEB_CRASH_AT
// kills it at a named step: the binary under test when it was built so, else one built once
// for the run.
var crashBin = builtOnce{prefix: "socialweb-e2e-crashbin-"}

func crashpointBinary(t *testing.T) string {
	t.Helper()
	return crashBin.get(t, func(dir string) (string, error) {
		if out, err := exec.Command("go", "version", "-m", socialwebBin).Output(); err == nil && strings.Contains(string(out), "-tags=crashpoints") {
			return socialwebBin, nil
		}
		path := filepath.Join(dir, "socialweb")
		ldflags, err := exec.Command("bash", "../../hack/kube-ldflags.sh").Output()
		if err != nil {
			return "", fmt.Errorf("hack/kube-ldflags.sh: %w", err)
		}
		out, err := exec.Command("go", "build", "-tags", "crashpoints", "-ldflags", strings.TrimSpace(string(ldflags)), "-o", path, "socialweb.computer/cmd/socialweb").CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("building socialweb with -tags crashpoints: %v\n%s", err, out)
		}
		return path, nil
	})
}

// A `socialweb bidder` killed (exit 137, nothing run after) at each step of a guest start
// between two writes, and started again over the same state dir: the contract becomes Held
// once and is never shown Released or Failed before its release; the bidder's repo holds one
// receipt of the accept; one guest runs (a guest booted before a roll back is gone, processes
// and dir); the release leaves no guest process.
func TestACC_MarketBidderCrashDuringStart(t *testing.T) {
	t.Parallel()
	bin := crashpointBinary(t)
	env := marketEnv(t)
	for i, c := range []struct {
		point, action string
	}{
		{crashpoint.BidderAfterBoot, "roll-back"},
		{crashpoint.BidderAfterReceipt, "complete"},
		{crashpoint.BidderBeforeStarted, "complete"},
	} {
		t.Run(c.point, func(t *testing.T) { crashDuringStart(t, env, bin, fmt.Sprintf("crash%d", i), c.point, c.action) })
	}
}

func crashDuringStart(t *testing.T, env *testenv.Env, bin, name, point, action string) {
	ctx := context.Background()
	handle := name + ".test"
	if _, err := env.PDS.CreateAccount(ctx, handle, "pw-"+handle); err != nil {
		t.Fatal(err)
	}
	bidderDID, _, err := env.PDS.Account(ctx, handle)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte("pw-"+handle+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	guests := filepath.Join(state, "guests")
	sub, err := deno.New(deno.Config{StateDir: guests})
	if err != nil || sub.Binary() == "" {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	args := []string{"bidder", "--pds", env.PDS.URL(), "--identifier", handle, "--password-file", pwFile, "--state-dir", state,
		"--cost", "1", "--log-level", "debug"}
	out := &testenv.LogBuffer{}
	var cmd *exec.Cmd
	start := func(extraEnv ...string) {
		t.Helper()
		cmd = exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), extraEnv...)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	start(crashpoint.Env + "=" + point)
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if pids := substratetest.Procs(guests); len(pids) != 0 {
			t.Errorf("guest processes left: %v", pids)
		}
	})
	substratetest.Cleanup(t, sub, guests)

	// Every phase the contract shows, until its release is asked.
	var mu sync.Mutex
	var phases []v1alpha1.ComputeContractPhase
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watchCtx.Err() == nil {
			var cc v1alpha1.ComputeContract
			if env.Client.Get(watchCtx, key(name), &cc) == nil {
				mu.Lock()
				if n := len(phases); n == 0 || phases[n-1] != cc.Status.Phase {
					phases = append(phases, cc.Status.Phase)
				}
				mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	newContract(t, env, name)

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 137 || !strings.Contains(out.String(), "crashpoint "+point) {
			t.Fatalf("bidder ended %v, want exit 137 at %s:\n%s", err, point, out.String())
		}
	case <-time.After(45 * time.Second):
		t.Fatalf("the bidder did not reach %s:\n%s", point, out.String())
	}
	start()

	c := waitContract(t, env, name, v1alpha1.ComputeContractHeld)
	testenv.Eventually(t, 15*time.Second, "vm.onNetwork", func() (bool, error) {
		if err := env.Client.Get(ctx, key(name), c); err != nil {
			return false, err
		}
		return c.Status.Guest != nil && c.Status.Guest.Address == "127.0.0.1", fmt.Errorf("guest %+v", c.Status.Guest)
	})
	if c.Status.Winner != bidderDID {
		t.Fatalf("winner %s, want the crashed bidder %s", c.Status.Winner, bidderDID)
	}
	if want := fmt.Sprintf("action=%s", action); !strings.Contains(out.String(), "market_start_recovered") || !strings.Contains(out.String(), want) {
		t.Fatalf("the restarted bidder's log shows no market_start_recovered with %s:\n%s", want, out.String())
	}

	// One receipt of the accept in the bidder's repo.
	repo, err := repos.Local(ctx, env.PDS, bidderDID)
	if err != nil {
		t.Fatal(err)
	}
	recs, _, err := repo.List(ctx, mk.ReceiptNSID, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range recs {
		var rc mk.Receipt
		if json.Unmarshal(r.Value, &rc) == nil && rc.Accept.URI == c.Status.Accept {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d receipts of %s, want 1", n, c.Status.Accept)
	}
	// One guest: the contract's, running; nothing else in the substrate.
	gs, err := sub.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != 1 || gs[0].ID != bidder.GuestID(c.Status.Accept) || gs[0].Phase != substrate.Running {
		t.Fatalf("guests %+v, want only %s Running", gs, bidder.GuestID(c.Status.Accept))
	}
	if _, err := os.Stat(filepath.Join(state, "intents", gs[0].ID+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the start intent is still there once the start is reported: %v", err)
	}

	stopWatch()
	<-watched
	mu.Lock()
	seen := append([]v1alpha1.ComputeContractPhase(nil), phases...)
	mu.Unlock()
	for _, p := range seen {
		if p == v1alpha1.ComputeContractReleased || p == v1alpha1.ComputeContractFailed {
			t.Fatalf("phases %v: shown %s before any release was asked", seen, p)
		}
	}
	release(t, env, name)
	waitContract(t, env, name, v1alpha1.ComputeContractReleased)
	waitNoProcs(t, guests)
}
