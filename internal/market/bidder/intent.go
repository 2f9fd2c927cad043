package bidder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"socialweb.computer/internal/atomicfile"
	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/substrate"
)

// A guest start is three writes to two places (the substrate's state dir, the bidder's repo)
// that no transaction joins: the guest, its receipt, its vm.started events. The bidder writes
// what it is about to do before it does it, an intent file per guest in its state dir, and
// advances it after each step; at restart recovery reads each intent, what the substrate and
// the repo hold, and a pure decision (decideStart) completes the start or rolls it back. A
// roll back writes no final event: the contract is still wanted, and the accept (replayed from
// the firehose) is answered again as if for the first time.

// startPhase is the last step of a guest start known done.
type startPhase string

const (
	// phaseBeforeBoot: the intent is written, the guest maybe half booted.
	phaseBeforeBoot startPhase = "before-boot"
	// phaseBooted: the substrate's Boot returned; the receipt maybe written.
	phaseBooted startPhase = "booted"
	// phaseReceiptWritten: the receipt is in the repo; vm.started maybe not.
	phaseReceiptWritten startPhase = "receipt-written"
)

// startIntent is STATE_DIR/intents/<guest id>.json. It goes once vm.started and
// vm.onNetwork are written or the contract ended.
type startIntent struct {
	Accept string     `json:"accept"`
	Guest  string     `json:"guest"`
	Phase  startPhase `json:"phase"`
	// ReceiptKey is the rkey of its receipt, chosen before the boot, and Receipt its value:
	// a receipt written again after a crash lands on the one written before, never beside it.
	ReceiptKey string     `json:"receiptKey"`
	Receipt    mk.Receipt `json:"receipt"`
	// Secrets: the guest boots with delivered secrets (the receipt was written first).
	Secrets bool `json:"secrets,omitempty"`
}

// startAction is what recovery does with an intent.
type startAction string

const (
	// actionComplete adopts the running guest and writes what is missing: the receipt (at
	// its key), then vm.started and vm.onNetwork once the guest runs.
	actionComplete startAction = "complete"
	// actionRollBack stops and removes whatever was booted and drops the intent; no event is
	// written, the contract stays wanted and its accept is answered again.
	actionRollBack startAction = "roll-back"
	// actionEnded drops the intent and leaves the receipt to recovery's rule for a held
	// guest that is gone: a receipt promised a guest and none runs.
	actionEnded startAction = "ended"
)

// decideStart is what recovery does with a start intent in phase, given whether its guest
// runs (listed and not ended) and whether its receipt is in the repo.
//
//   - A receipt and a running guest: complete (the requester was promised this guest).
//   - A receipt and no running guest: ended; the receipt's own recovery reports it (or waits
//     for secrets never delivered), as for any held guest.
//   - No receipt, before-boot: roll back, running or not. Boot may have stopped halfway (a
//     process without its forwarders, a dir without a process); nothing was promised yet.
//   - No receipt, booted or later, a running guest: complete; Boot returned, the guest is
//     whole, only the receipt is missing.
//   - No receipt, no running guest: roll back; the guest ended before anyone was told of it.
func decideStart(phase startPhase, guestAlive, receiptSeen bool) startAction {
	switch {
	case receiptSeen && guestAlive:
		return actionComplete
	case receiptSeen:
		return actionEnded
	case phase == phaseBeforeBoot || !guestAlive:
		return actionRollBack
	}
	return actionComplete
}

// intentsDir holds the start intents in the state dir.
const intentsDir = "intents"

func (b *Bidder) intentPath(guest string) string {
	return filepath.Join(b.cfg.StateDir, intentsDir, guest+".json")
}

// writeIntent saves in durably (file and directory synced) before the step it announces.
// Without a state dir the bidder keeps no intents, and recovery has only its repo.
func (b *Bidder) writeIntent(in startIntent) error {
	if b.cfg.StateDir == "" {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(b.cfg.StateDir, intentsDir), 0o700); err != nil {
		return &IntentError{Guest: in.Guest, Op: "write", Err: err}
	}
	raw, err := json.Marshal(in)
	if err != nil {
		return &IntentError{Guest: in.Guest, Op: "write", Err: err}
	}
	if err := atomicfile.WriteDurable(b.intentPath(in.Guest), raw, 0o600); err != nil {
		return &IntentError{Guest: in.Guest, Op: "write", Err: err}
	}
	return nil
}

// advanceIntent records that in reached phase. A failure is logged, not returned: the step
// is done, and an intent left behind only makes recovery redo an idempotent write.
func (b *Bidder) advanceIntent(in *startIntent, phase startPhase) {
	in.Phase = phase
	if err := b.writeIntent(*in); err != nil {
		b.log.Warn("intent", "guest", in.Guest, "err", err)
	}
}

// dropIntent removes the intent of guest, once its start is reported or its contract ended.
func (b *Bidder) dropIntent(guest string) {
	if b.cfg.StateDir == "" {
		return
	}
	err := os.Remove(b.intentPath(guest))
	if err == nil {
		err = atomicfile.SyncDir(filepath.Dir(b.intentPath(guest)))
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		b.log.Warn("intent", "guest", guest, "err", &IntentError{Guest: guest, Op: "remove", Err: err})
	}
}

// loadIntents reads every intent in the state dir, sorted by guest. A file that does not read
// or names another guest than its name is an error: recovery cannot tell what was started.
func (b *Bidder) loadIntents() ([]startIntent, error) {
	if b.cfg.StateDir == "" {
		return nil, nil
	}
	dir := filepath.Join(b.cfg.StateDir, intentsDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, &IntentError{Op: "read", Err: err}
	}
	var out []startIntent
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue // atomicfile's temporaries of a write the crash cut short
		}
		guest := strings.TrimSuffix(name, ".json")
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, &IntentError{Guest: guest, Op: "read", Err: err}
		}
		var in startIntent
		if err := json.Unmarshal(raw, &in); err != nil {
			return nil, &IntentError{Guest: guest, Op: "read", Err: err}
		}
		switch {
		case in.Guest != guest || !substrate.ValidID(guest) || GuestID(in.Accept) != guest:
			return nil, &IntentError{Guest: guest, Op: "read", Err: fmt.Errorf("names guest %q of accept %q", in.Guest, in.Accept)}
		case in.Phase != phaseBeforeBoot && in.Phase != phaseBooted && in.Phase != phaseReceiptWritten:
			return nil, &IntentError{Guest: guest, Op: "read", Err: fmt.Errorf("unknown phase %q", in.Phase)}
		}
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Guest < out[j].Guest })
	return out, nil
}

// IntentError is a start intent that could not be written, read or removed. A bidder whose
// intents do not read refuses to start rather than guess which guests it started: the
// operator removes the file named (its guest is then treated as one without a receipt).
type IntentError struct {
	Guest string
	Op    string // "write", "read", "remove"
	Err   error
}

func (e *IntentError) Error() string {
	if e.Guest == "" {
		return fmt.Sprintf("start intents: %s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("start intent of guest %s: %s: %v", e.Guest, e.Op, e.Err)
}

func (e *IntentError) Unwrap() error { return e.Err }

// recoverStarts applies decideStart to every intent in the state dir, with byID the
// substrate's guests (a rolled back guest is taken out of it) and b.receipts read from the
// repo (a completed start's missing receipt is added). It returns the accepts whose start is
// to be reported (vm.started, vm.onNetwork) once the guest runs.
func (b *Bidder) recoverStarts(ctx context.Context, byID map[string]substrate.GuestStatus) (map[string]bool, error) {
	intents, err := b.loadIntents()
	if err != nil {
		return nil, err
	}
	resume := map[string]bool{}
	for _, in := range intents {
		g, listed := byID[in.Guest]
		alive := listed && !g.Phase.Ended()
		_, seen := b.receipts[in.Accept]
		act := decideStart(in.Phase, alive, seen)
		if act == actionComplete && !seen && in.Secrets {
			// Its receipt was written before the boot and is gone from the repo: nothing to
			// complete against, and its secrets are not kept to boot it again.
			act = actionRollBack
		}
		b.log.Info("market_start_recovered", "accept", in.Accept, "guest", in.Guest, "phase", string(in.Phase),
			"guest_running", alive, "receipt", seen, "action", string(act))
		switch act {
		case actionRollBack:
			if listed {
				b.stop(ctx, in.Guest)
				delete(byID, in.Guest)
			}
			b.dropIntent(in.Guest)
		case actionEnded:
			b.dropIntent(in.Guest)
		case actionComplete:
			if !seen {
				rc, err := b.writeReceipt(ctx, in)
				if err != nil {
					return nil, fmt.Errorf("receipt of %s: %w", in.Accept, err)
				}
				b.receipts[in.Accept] = rc
				b.advanceIntent(&in, phaseReceiptWritten)
			}
			resume[in.Accept] = true
		}
	}
	return resume, nil
}

// writeReceipt writes in's receipt at its key, or finds the one a crashed run wrote there.
func (b *Bidder) writeReceipt(ctx context.Context, in startIntent) (atrepo.StrongRef, error) {
	raw, err := json.Marshal(in.Receipt)
	if err != nil {
		return atrepo.StrongRef{}, err
	}
	rec, err := feed.PutOnce(ctx, b.cfg.Repo, mk.ReceiptNSID, in.ReceiptKey, raw)
	if err != nil {
		return atrepo.StrongRef{}, err
	}
	return atrepo.StrongRef{URI: rec.URI, CID: rec.CID}, nil
}

// rkeyOf is the record key of an at-uri ("" when it does not parse).
func rkeyOf(uri string) string {
	u, err := infra.ParseATURI(uri)
	if err != nil {
		return ""
	}
	return u.Rkey.String()
}
