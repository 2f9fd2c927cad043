package infra

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"socialweb.computer/api/v1alpha1"
)

// The sync property: random interleavings of spec edits, record edits (some of them records
// that do not decode), record deletes, reconciles and the AtprotoRecord child's writes, with
// lost writes on every path (a pull that fails to apply, a status update that fails, a child
// apply that fails, a record write that never happens), are driven through Decide against a
// small store simulated here. Every run checks:
//
//   - no edit is lost silently: when a pull replaces a kcp edit the record never held, the
//     decision was a Conflict (the edit is reported as the losing side); when a write replaces
//     a record edit the spec never held, the mode is Publish and the write was flagged as an
//     overwrite;
//   - the record wins every true conflict: when the spec holds a kcp edit the record never held
//     and the record holds a record edit the spec never held, Decide (sync Both) says Conflict
//     and pulls the record;
//   - conflicts only when needed: while no status write was lost, a Conflict always has a
//     record edit the spec never held on the record side;
//   - the sides converge: once edits and losses stop, a few reconciles reach InSync with both
//     sides equal, and one more reconcile changes nothing.

const (
	propertyRuns  = 1000
	propertySteps = 60
)

type simRecord struct {
	decl    Declaration
	cid     string
	invalid bool
}

type simWrite struct {
	decl      Declaration
	swap      string
	overwrite bool
}

type simEdit struct {
	side     string // "kcp" or "record"
	inSpec   bool   // the spec held it at some point
	inRecord bool   // the record held it at some point
	reported bool   // reported as the losing side of a conflict
}

type sim struct {
	t         *testing.T
	r         *rand.Rand
	trace     []string
	mode      v1alpha1.RecordSyncMode
	following bool

	spec    Declaration
	gen     int64
	stored  *v1alpha1.InfraRecordStatus
	record  *simRecord
	child   *simWrite
	nextCID int
	nextID  int
	now     time.Time

	edits  map[string]*simEdit // by declaration hash
	hashes map[string]string   // declaration hash by description: every edit has its own description
	gone   bool                // the object was deleted
	// statusLost is set once a status write was lost.
	statusLost bool
	lossy      bool
}

func (s *sim) logf(format string, args ...any) {
	s.trace = append(s.trace, fmt.Sprintf(format, args...))
}

func (s *sim) failf(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("%s\ntrace:\n  %s", fmt.Sprintf(format, args...), strings.Join(s.trace, "\n  "))
}

func (s *sim) newDecl(side string) Declaration {
	s.nextID++
	d := randomDeclaration(s.r)
	d.Description = fmt.Sprintf("%s%d", side, s.nextID)
	s.edits[s.hash(d)] = &simEdit{side: side}
	return d
}

func (s *sim) hash(d Declaration) string {
	h, ok := s.hashes[d.Description]
	if !ok {
		h = Hash(d)
		s.hashes[d.Description] = h
	}
	return h
}

func (s *sim) cid() string { s.nextCID++; return fmt.Sprintf("c%d", s.nextCID) }

func (s *sim) lose(p float64) bool { return s.lossy && s.r.Float64() < p }

// observe records which side has held which edit.
func (s *sim) observe() {
	hk := s.hash(s.spec)
	if e := s.edits[hk]; e != nil {
		e.inSpec = true
	}
	if s.record != nil && !s.record.invalid {
		hr := s.hash(s.record.decl)
		if e := s.edits[hr]; e != nil {
			e.inRecord = true
		}
	}
}

func (s *sim) kcpEdit() {
	s.spec = s.newDecl("k")
	s.gen++
	s.logf("kcp edit %s gen %d", s.spec.Description, s.gen)
}

func (s *sim) recordEdit() {
	if s.r.Intn(20) == 0 {
		s.record = &simRecord{invalid: true, cid: s.cid()}
		s.logf("record edit: invalid, %s", s.record.cid)
		return
	}
	s.record = &simRecord{decl: s.newDecl("r"), cid: s.cid()}
	s.logf("record edit %s %s", s.record.decl.Description, s.record.cid)
}

func (s *sim) recordDelete() {
	s.record = nil
	s.logf("record deleted")
}

func (s *sim) read() RecordRead {
	if s.record == nil {
		return RecordRead{}
	}
	if s.record.invalid {
		return RecordRead{Found: true, CID: s.record.cid, Invalid: &InvalidRecordError{Reason: InvalidDuplicateName}}
	}
	return RecordRead{Found: true, CID: s.record.cid, Declaration: s.record.decl}
}

func (s *sim) reconcile() SyncDecision {
	s.now = s.now.Add(time.Second)
	rec := s.read()
	in := SyncInput{Bound: true, Mode: s.mode, Following: s.following, Rkey: "web", URI: uri, Generation: s.gen,
		Spec: s.spec, Stored: s.stored.DeepCopy(), Record: rec, Now: s.now}
	d := Decide(in)
	s.logf("reconcile gen %d spec %s record %s: %s", s.gen, s.spec.Description, describe(s.record), d.Action)
	hk := s.hash(s.spec)

	// The record wins every true conflict.
	if s.mode != v1alpha1.RecordSyncPublish && rec.Found && rec.Invalid == nil {
		er, ek := s.edits[s.hash(rec.Declaration)], s.edits[hk]
		trueConflict := er != nil && er.side == "r" && !er.inSpec && ek != nil && ek.side == "k" && !ek.inRecord
		if trueConflict && d.Action != ActionConflict {
			s.failf("true conflict (kcp edit %s, record edit %s) decided %s", s.spec.Description, rec.Declaration.Description, d.Action)
		}
	}
	if d.Action == ActionConflict || d.Action == ActionPull {
		if s.mode == v1alpha1.RecordSyncPublish {
			s.failf("Publish pulled (%s)", d.Action)
		}
		if d.Pull == nil || s.hash(*d.Pull) != s.hash(rec.Declaration) {
			s.failf("%s does not pull the record's declaration", d.Action)
		}
	}
	if d.Action == ActionConflict {
		if e := s.edits[hk]; e != nil {
			e.reported = true
		}
		// Conflicts only when needed: unless a status write was lost (which leaves a stale
		// hash behind), the record holds an edit made elsewhere that the spec never held.
		if er := s.edits[s.hash(rec.Declaration)]; !s.statusLost && (er == nil || er.side != "r" || er.inSpec) {
			s.failf("Conflict without an unseen record edit (record %s)", rec.Declaration.Description)
		}
	}

	switch d.Action {
	case ActionPull, ActionConflict:
		if s.lose(0.2) {
			s.logf("  pull lost")
			return d
		}
		if e := s.edits[hk]; e != nil && e.side == "k" && !e.inRecord && !e.reported {
			s.failf("pull replaced kcp edit %s, which the record never held, without reporting a conflict", s.spec.Description)
		}
		s.spec = *d.Pull
		s.gen++
		s.storeStatus(d)
	case ActionCreate, ActionPush:
		if s.lose(0.1) {
			s.logf("  child apply lost")
			return d
		}
		s.child = &simWrite{decl: s.spec, swap: d.SwapCID, overwrite: d.Overwrite}
		s.storeStatus(d)
	case ActionInSync:
		s.storeStatus(d)
		if s.r.Intn(3) == 0 { // StatusWriteDue said yes: the status part changes the cid
			s.child = &simWrite{decl: s.spec, swap: d.SwapCID}
		}
	case ActionDelete:
		if s.mode == v1alpha1.RecordSyncPublish {
			s.failf("Publish deleted the object")
		}
		if s.record != nil {
			s.failf("Delete while the record exists")
		}
		s.gone = true
	case ActionInvalid, ActionUnavailable:
	default:
		s.failf("unexpected action %s", d.Action)
	}
	return d
}

func (s *sim) storeStatus(d SyncDecision) {
	if d.Record == nil {
		return
	}
	if s.lose(0.1) {
		s.logf("  status write lost")
		s.statusLost = true
		return
	}
	s.stored = d.Record.DeepCopy()
}

// flush is the AtprotoRecord controller: it writes the child's record only while the repo
// holds the swap cid (absent for an empty swap).
func (s *sim) flush() {
	w := s.child
	if w == nil {
		return
	}
	s.child = nil
	if s.lose(0.15) {
		s.logf("  record write lost")
		return
	}
	ok := (w.swap == "" && s.record == nil) || (s.record != nil && s.record.cid == w.swap)
	if !ok {
		s.logf("  record write: swap mismatch")
		return
	}
	if s.record != nil && !s.record.invalid {
		old := s.hash(s.record.decl)
		if e := s.edits[old]; e != nil && e.side == "r" && !e.inSpec && old != s.hash(w.decl) {
			if s.mode != v1alpha1.RecordSyncPublish || !w.overwrite {
				s.failf("write replaced record edit %s, which the spec never held, silently", s.record.decl.Description)
			}
		}
	}
	s.record = &simRecord{decl: w.decl, cid: s.cid()}
	s.logf("  record written %s %s", w.decl.Description, s.record.cid)
}

func describe(r *simRecord) string {
	switch {
	case r == nil:
		return "absent"
	case r.invalid:
		return "invalid@" + r.cid
	}
	return r.decl.Description + "@" + r.cid
}

func runSim(t *testing.T, seed int64, mode v1alpha1.RecordSyncMode, following, preexisting bool) {
	s := &sim{t: t, r: rand.New(rand.NewSource(seed)), mode: mode, following: following, edits: map[string]*simEdit{}, hashes: map[string]string{},
		now: t0, gen: 1, lossy: true}
	s.logf("seed %d mode %s following %v preexisting %v", seed, mode, following, preexisting)
	if following {
		s.spec = Declaration{}
	} else {
		s.spec = s.newDecl("k")
	}
	if following || preexisting {
		s.record = &simRecord{decl: s.newDecl("r"), cid: s.cid()}
	}
	s.observe()
	for step := 0; step < propertySteps && !s.gone; step++ {
		switch x := s.r.Float64(); {
		case x < 0.18:
			s.kcpEdit()
		case x < 0.32:
			s.recordEdit()
		case x < 0.335:
			s.recordDelete()
		case x < 0.70:
			s.reconcile()
		default:
			s.flush()
		}
		s.observe()
	}
	if s.gone {
		return
	}
	// Quiet: no more edits, nothing lost. The record may still be invalid or absent; a real
	// owner fixes the one, and the other either deletes the object (Both) or is written again.
	s.lossy = false
	s.logf("-- quiet")
	if s.record != nil && s.record.invalid {
		s.recordEdit()
		for s.record.invalid {
			s.recordEdit()
		}
		s.observe()
	}
	for i := 0; i < 12; i++ {
		d := s.reconcile()
		s.flush()
		s.observe()
		if s.gone {
			return
		}
		if d.Action == ActionInSync && s.record != nil && s.hash(s.record.decl) == s.hash(s.spec) {
			again := s.reconcile()
			if again.Action != ActionInSync {
				s.failf("converged, then decided %s", again.Action)
			}
			return
		}
	}
	s.failf("did not converge: spec %s record %s", s.spec.Description, describe(s.record))
}

func TestDecideProperty(t *testing.T) {
	variants := []struct {
		name                   string
		mode                   v1alpha1.RecordSyncMode
		following, preexisting bool
	}{
		{name: "both publishing", mode: v1alpha1.RecordSyncBoth},
		{name: "both publishing over an existing record", mode: v1alpha1.RecordSyncBoth, preexisting: true},
		{name: "both following", mode: v1alpha1.RecordSyncBoth, following: true},
		{name: "publish", mode: v1alpha1.RecordSyncPublish},
		{name: "publish over an existing record", mode: v1alpha1.RecordSyncPublish, preexisting: true},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			for seed := int64(1); seed <= propertyRuns; seed++ {
				runSim(t, seed, v.mode, v.following, v.preexisting)
			}
		})
	}
}
