package bidder

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/substrate"
)

func TestDecideStart(t *testing.T) {
	for _, c := range []struct {
		phase              startPhase
		alive, receiptSeen bool
		want               startAction
	}{
		// Crash after the intent, or inside Boot: nothing promised, whatever runs goes.
		{phaseBeforeBoot, false, false, actionRollBack},
		{phaseBeforeBoot, true, false, actionRollBack},
		// Boot returned: a running guest only lacks its receipt; one that ended is retried.
		{phaseBooted, true, false, actionComplete},
		{phaseBooted, false, false, actionRollBack},
		// A receipt the repo does not list (lost) is written again at its key.
		{phaseReceiptWritten, true, false, actionComplete},
		{phaseReceiptWritten, false, false, actionRollBack},
		// A receipt was written: the requester was promised the guest.
		{phaseBeforeBoot, true, true, actionComplete}, // a boot with secrets, its return unrecorded
		{phaseBooted, true, true, actionComplete},
		{phaseReceiptWritten, true, true, actionComplete},
		{phaseBeforeBoot, false, true, actionEnded},
		{phaseBooted, false, true, actionEnded},
		{phaseReceiptWritten, false, true, actionEnded},
	} {
		if got := decideStart(c.phase, c.alive, c.receiptSeen); got != c.want {
			t.Errorf("decideStart(%s, running %v, receipt %v) = %s, want %s", c.phase, c.alive, c.receiptSeen, got, c.want)
		}
	}
}

// The intent is on disk, saying before-boot, when the substrate boots the guest, and gone
// once the start is reported.
func TestIntentBeforeBoot(t *testing.T) {
	e := newEnv(t)
	var seen []startPhase
	e.sub.onBoot = func(spec substrate.GuestSpec) {
		raw, err := os.ReadFile(filepath.Join(e.stateDir, intentsDir, spec.ID+".json"))
		var in startIntent
		if err == nil {
			err = json.Unmarshal(raw, &in)
		}
		if err != nil {
			t.Errorf("no intent at boot: %v", err)
		}
		seen = append(seen, in.Phase)
	}
	h := e.hold()
	if len(seen) != 1 || seen[0] != phaseBeforeBoot {
		t.Fatalf("intent phases at boot %q, want [before-boot]", seen)
	}
	eventually(t, "the intent dropped once reported", func() bool {
		_, err := os.Stat(filepath.Join(e.stateDir, intentsDir, h.id+".json"))
		return errors.Is(err, os.ErrNotExist)
	})
}

// A bidder that died at each step of a guest start (the state each crash point leaves:
// intent, guest, receipt) and started again over the same state dir and repo: the contract
// ends started once, with one receipt, no final event, and no guest left beside it.
func TestStartCrash(t *testing.T) {
	for _, c := range []struct {
		name    string
		phase   startPhase
		guest   substrate.Phase // "" none
		receipt bool
		// rolledBack: the guest is stopped (if any) and booted again from the replayed accept.
		rolledBack bool
	}{
		{name: "after intent", phase: phaseBeforeBoot, rolledBack: true},
		{name: "inside boot", phase: phaseBeforeBoot, guest: substrate.Booting, rolledBack: true},
		{name: "after boot", phase: phaseBeforeBoot, guest: substrate.Running, rolledBack: true},
		{name: "after booted recorded", phase: phaseBooted, guest: substrate.Running},
		{name: "after receipt", phase: phaseBooted, guest: substrate.Running, receipt: true},
		{name: "before started", phase: phaseReceiptWritten, guest: substrate.Running, receipt: true},
		{name: "guest ended before its receipt", phase: phaseBooted, guest: substrate.Exited, rolledBack: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			b, stop := e.start(1)
			rfp := e.rfp(b)
			bid := e.mustBid(rfp)
			stop()
			acc := e.write(e.requester, mk.AcceptNSID, mk.Accept{RFP: rfp, Bid: bid})
			id := GuestID(acc.URI)
			in := startIntent{Accept: acc.URI, Guest: id, Phase: c.phase, ReceiptKey: feed.TID(),
				Receipt: mk.Receipt{Accept: acc, Bid: bid, CID: acc.CID, RFP: rfp}}
			if err := (&Bidder{cfg: Config{StateDir: e.stateDir}}).writeIntent(in); err != nil {
				t.Fatal(err)
			}
			if c.guest != "" {
				e.sub.set(id, c.guest)
			}
			if c.receipt {
				raw, _ := json.Marshal(in.Receipt)
				if _, err := e.repo.Put(e.ctx, mk.ReceiptNSID, in.ReceiptKey, raw, nil); err != nil {
					t.Fatal(err)
				}
			}
			b, _ = e.start(1)
			e.deliver(b, acc) // the replay carries the accept again
			var rc atrepo.StrongRef
			eventually(t, "one receipt", func() bool {
				var ok bool
				rc, ok = e.receiptOf(acc)
				return ok
			})
			eventually(t, "vm.started", func() bool { return e.started(rc) })
			if r := e.finalReasons(rc); len(r) != 0 {
				t.Fatalf("final events %q: the contract is still wanted", r)
			}
			if p := e.sub.phase(id); p != substrate.Running {
				t.Fatalf("guest %q, want Running", p)
			}
			boots, stops := e.sub.counts(id)
			wantBoots, wantStops := 0, 0
			if c.rolledBack {
				wantBoots = 1
				if c.guest != "" {
					wantStops = 1
				}
			}
			if boots != wantBoots || stops != wantStops {
				t.Fatalf("boots %d, stops %d; want %d, %d", boots, stops, wantBoots, wantStops)
			}
			if !c.rolledBack && !strings.HasSuffix(rc.URI, "/"+in.ReceiptKey) {
				t.Fatalf("receipt %s, want it at the intent's key %s", rc.URI, in.ReceiptKey)
			}
			eventually(t, "the intent dropped", func() bool {
				_, err := os.Stat(filepath.Join(e.stateDir, intentsDir, id+".json"))
				return errors.Is(err, os.ErrNotExist)
			})
		})
	}
}

// A receipt written and its guest gone: the guest ran and ended, and it is reported as any
// held guest that ended while the bidder was down; nothing boots again.
func TestStartCrashGuestGone(t *testing.T) {
	e := newEnv(t)
	h := e.hold()
	h.stop()
	in := startIntent{Accept: h.accept.URI, Guest: h.id, Phase: phaseReceiptWritten, ReceiptKey: rkeyOf(h.receipt.URI)}
	if err := (&Bidder{cfg: Config{StateDir: e.stateDir}}).writeIntent(in); err != nil {
		t.Fatal(err)
	}
	e.sub.drop(h.id)
	b, _ := e.start(1)
	e.deliver(b, h.accept)
	if r := e.finalReason(h.receipt); !strings.Contains(r, "gone while the bidder was down") {
		t.Fatalf("final reason %q", r)
	}
	if boots, _ := e.sub.counts(h.id); boots != 1 {
		t.Fatalf("%d boots, want 1", boots)
	}
}

// An intent that does not read stops the bidder at start with the file named.
func TestIntentUnreadable(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, intentsDir), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"gbad.json": "{", "g0000000000000000.json": `{"accept":"at://x","guest":"g0000000000000000","phase":"before-boot"}`} {
		p := filepath.Join(dir, intentsDir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := (&Bidder{cfg: Config{StateDir: dir}}).loadIntents()
		var ie *IntentError
		if !errors.As(err, &ie) || ie.Guest != strings.TrimSuffix(name, ".json") {
			t.Fatalf("%s: %v, want an IntentError naming the guest", name, err)
		}
		os.Remove(p)
	}
	// A temporary of a cut-short write is not an intent.
	if err := os.WriteFile(filepath.Join(dir, intentsDir, ".g1.json.123"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if ins, err := (&Bidder{cfg: Config{StateDir: dir}}).loadIntents(); err != nil || len(ins) != 0 {
		t.Fatalf("%v %v, want none", ins, err)
	}
}
