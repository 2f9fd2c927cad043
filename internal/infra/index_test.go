package infra

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	atinfra "socialweb.computer/internal/atproto/infra"
)

func entry(rkey string) atinfra.InfraIndexEntry {
	return IndexEntryFor(KindInfra, rkey, t0, nil, "core")
}

func TestIndexPass(t *testing.T) {
	now := t0.Add(time.Hour)
	at := func(t time.Time) *string { s := formatTime(t); return &s }
	withLive := func(es ...atinfra.InfraIndexEntry) *atinfra.InfraIndex {
		return &atinfra.InfraIndex{Live: es, UpdatedAt: formatTime(t0)}
	}
	added := func(e atinfra.InfraIndexEntry, when time.Time) atinfra.InfraIndexEntry {
		e.AddedAt = at(when)
		return e
	}
	expiredE := IndexEntryFor(KindEphemeralInfra, "old", t0, tp(now.Add(-IndexGoneAfter)), "core")
	expiringE := IndexEntryFor(KindEphemeralInfra, "soon", t0, tp(now.Add(-IndexGoneAfter+time.Second)), "core")
	full := withLive()
	for i := 0; i < IndexMaxLive; i++ {
		full.Live = append(full.Live, added(entry(fmt.Sprintf("r%d", i)), t0))
	}
	tests := []struct {
		name        string
		index       *atinfra.InfraIndex
		entry       atinfra.InfraIndexEntry
		live        bool
		want        *atinfra.InfraIndex
		wantChanged bool
	}{
		{name: "first entry creates the index", entry: entry("web"), live: true,
			want: &atinfra.InfraIndex{Live: []atinfra.InfraIndexEntry{added(entry("web"), now)}, UpdatedAt: formatTime(now)}, wantChanged: true},
		{name: "no index and not live: nothing", entry: entry("web"), live: false},
		{name: "present and unchanged: nothing", index: withLive(added(entry("web"), t0)), entry: entry("web"), live: true,
			want: withLive(added(entry("web"), t0))},
		{name: "refresh keeps addedAt", index: withLive(added(entry("web"), t0)), entry: IndexEntryFor(KindInfra, "web", t0, nil, "embedded"), live: true,
			want: &atinfra.InfraIndex{Live: []atinfra.InfraIndexEntry{added(IndexEntryFor(KindInfra, "web", t0, nil, "embedded"), t0)}, UpdatedAt: formatTime(now)}, wantChanged: true},
		{name: "same rkey in the other collection is another entry", index: withLive(added(entry("web"), t0)),
			entry: IndexEntryFor(KindEphemeralInfra, "web", t0, nil, "core"), live: true,
			want: &atinfra.InfraIndex{Live: []atinfra.InfraIndexEntry{added(entry("web"), t0), added(IndexEntryFor(KindEphemeralInfra, "web", t0, nil, "core"), now)}, UpdatedAt: formatTime(now)}, wantChanged: true},
		{name: "ended record leaves live", index: withLive(added(entry("a"), t0), added(entry("web"), t0)), entry: entry("web"), live: false,
			want: &atinfra.InfraIndex{Live: []atinfra.InfraIndexEntry{added(entry("a"), t0)}, UpdatedAt: formatTime(now)}, wantChanged: true},
		{name: "expired ephemeral entries are dropped", index: withLive(added(expiredE, t0), added(expiringE, t0)), entry: entry("web"), live: true,
			want: &atinfra.InfraIndex{Live: []atinfra.InfraIndexEntry{added(expiringE, t0), added(entry("web"), now)}, UpdatedAt: formatTime(now)}, wantChanged: true},
		{name: "full: no room for another", index: full, entry: entry("extra"), live: true, want: full},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before string
			if tc.index != nil {
				before = fmt.Sprint(*tc.index)
			}
			got, changed := IndexPass(tc.index, tc.entry, tc.live, now)
			if changed != tc.wantChanged {
				t.Errorf("changed = %v", changed)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
			if tc.index != nil && fmt.Sprint(*tc.index) != before {
				t.Error("the input index was modified")
			}
			if changed {
				again, changed2 := IndexPass(got, tc.entry, tc.live, now)
				if changed2 || again != got {
					t.Error("a second identical pass changed the index")
				}
			}
		})
	}
}

func TestIndexEnd(t *testing.T) {
	now := t0.Add(time.Hour)
	ended := func(rkey string, at time.Time, reason string) atinfra.InfraIndexEnded {
		s := formatTime(at)
		return atinfra.InfraIndexEnded{Collection: atinfra.InfraNSID, Rkey: rkey, EndedAt: &s, EndReason: ptrIf(reason)}
	}
	var many []atinfra.InfraIndexEnded
	for i := 0; i < IndexMaxEnded; i++ {
		many = append(many, ended(fmt.Sprintf("e%d", i), t0.Add(-time.Duration(i)*time.Minute), "deleted"))
	}
	tests := []struct {
		name        string
		index       *atinfra.InfraIndex
		rkey        string
		endedAt     time.Time
		want        *atinfra.InfraIndex
		wantChanged bool
	}{
		{name: "no index yet", rkey: "web", endedAt: t0,
			want: &atinfra.InfraIndex{RecentEnded: []atinfra.InfraIndexEnded{ended("web", t0, "deleted")}, UpdatedAt: formatTime(now)}, wantChanged: true},
		{name: "moves from live to the front of ended", rkey: "web", endedAt: t0.Add(time.Minute),
			index: &atinfra.InfraIndex{Live: []atinfra.InfraIndexEntry{entry("web"), entry("a")}, RecentEnded: []atinfra.InfraIndexEnded{ended("x", t0, "complete")}},
			want: &atinfra.InfraIndex{Live: []atinfra.InfraIndexEntry{entry("a")},
				RecentEnded: []atinfra.InfraIndexEnded{ended("web", t0.Add(time.Minute), "deleted"), ended("x", t0, "complete")}, UpdatedAt: formatTime(now)}, wantChanged: true},
		{name: "newest first even when ended late", rkey: "web", endedAt: t0.Add(-time.Hour),
			index: &atinfra.InfraIndex{RecentEnded: []atinfra.InfraIndexEnded{ended("x", t0, "complete")}},
			want:  &atinfra.InfraIndex{RecentEnded: []atinfra.InfraIndexEnded{ended("x", t0, "complete"), ended("web", t0.Add(-time.Hour), "deleted")}, UpdatedAt: formatTime(now)}, wantChanged: true},
		{name: "at most 32, the oldest go", rkey: "web", endedAt: t0.Add(time.Minute), index: &atinfra.InfraIndex{RecentEnded: many},
			want: &atinfra.InfraIndex{RecentEnded: append([]atinfra.InfraIndexEnded{ended("web", t0.Add(time.Minute), "deleted")}, many[:IndexMaxEnded-1]...), UpdatedAt: formatTime(now)}, wantChanged: true},
		{name: "already ended: nothing", rkey: "web", endedAt: t0,
			index: &atinfra.InfraIndex{RecentEnded: []atinfra.InfraIndexEnded{ended("web", t0, "deleted")}, UpdatedAt: "u"},
			want:  &atinfra.InfraIndex{RecentEnded: []atinfra.InfraIndexEnded{ended("web", t0, "deleted")}, UpdatedAt: "u"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := IndexEnd(tc.index, atinfra.InfraNSID, tc.rkey, tc.endedAt, EndReasonDeleted, now)
			if changed != tc.wantChanged {
				t.Errorf("changed = %v", changed)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
			if _, again := IndexEnd(got, atinfra.InfraNSID, tc.rkey, tc.endedAt, EndReasonDeleted, now.Add(time.Second)); again {
				t.Error("a second identical end changed the index")
			}
		})
	}
}

// Random passes and ends keep the limits, never duplicate an entry, keep recentEnded newest
// first, always validate as a record, and a repeated call is always "no change".
func TestIndexProperty(t *testing.T) {
	r := rand.New(rand.NewSource(29))
	for run := 0; run < 12; run++ {
		var idx *atinfra.InfraIndex
		now := t0
		for step := 0; step < 400; step++ {
			now = now.Add(time.Duration(r.Intn(120)) * time.Second)
			rkey := fmt.Sprintf("r%d", r.Intn(300))
			kind := KindInfra
			var exp *time.Time
			if r.Intn(3) == 0 {
				kind = KindEphemeralInfra
				exp = tp(now.Add(time.Duration(r.Intn(3600)) * time.Second))
			}
			var again bool
			if r.Intn(4) == 0 {
				idx, _ = IndexEnd(idx, kind.Collection(), rkey, now, EndReasonDeleted, now)
				_, again = IndexEnd(idx, kind.Collection(), rkey, now, EndReasonDeleted, now)
			} else {
				e := IndexEntryFor(kind, rkey, t0, exp, strings.Repeat("w", r.Intn(80)))
				live := r.Intn(5) != 0
				idx, _ = IndexPass(idx, e, live, now)
				_, again = IndexPass(idx, e, live, now)
			}
			if again {
				t.Fatalf("run %d step %d: repeat changed the index", run, step)
			}
			if idx == nil {
				continue
			}
			if len(idx.Live) > IndexMaxLive || len(idx.RecentEnded) > IndexMaxEnded {
				t.Fatalf("limits: %d live, %d ended", len(idx.Live), len(idx.RecentEnded))
			}
			seen := map[string]bool{}
			for _, e := range idx.Live {
				k := e.Collection + "/" + e.Rkey
				if seen[k] || (e.Writer != nil && len(*e.Writer) > WriterMaxLen) {
					t.Fatalf("duplicate or long entry %s", k)
				}
				seen[k] = true
			}
			for i := 1; i < len(idx.RecentEnded); i++ {
				if endedTime(idx.RecentEnded[i]).After(endedTime(idx.RecentEnded[i-1])) {
					t.Fatalf("recentEnded not newest first")
				}
			}
			if step == 399 || len(idx.Live) == IndexMaxLive { // once a run: the lexicon validator is slow on a full index
				rec := atinfra.Infra{Index: idx, CreatedAt: formatTime(t0)}
				if err := rec.Validate(); err != nil {
					t.Fatalf("index record invalid: %v", err)
				}
			}
		}
	}
}

func TestWriterLabel(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"short", "core", "core"},
		{"64", strings.Repeat("a", 64), strings.Repeat("a", 64)},
		{"trimmed", "gateway:" + strings.Repeat("h", 100), "gateway:" + strings.Repeat("h", 56)},
		{"rune boundary", strings.Repeat("é", 40), strings.Repeat("é", 32)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := WriterLabel(tc.in); got != tc.want {
				t.Errorf("got %q", got)
			}
		})
	}
}

func TestEntryGone(t *testing.T) {
	young := IndexEntryFor(KindInfra, "web", t0, nil, "core")
	young.AddedAt = tp2(t0)
	tests := []struct {
		name  string
		e     atinfra.InfraIndexEntry
		found bool
		now   time.Time
		want  bool
	}{
		{"record there", young, true, t0.Add(time.Hour), false},
		{"no record yet, young", young, false, t0.Add(IndexGoneAfter - time.Second), false},
		{"no record, old", young, false, t0.Add(IndexGoneAfter), true},
		{"ephemeral long past its deadline", IndexEntryFor(KindEphemeralInfra, "x", t0, tp(t0), "core"), true, t0.Add(IndexGoneAfter), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := EntryGone(tc.e, tc.found, tc.now); got != tc.want {
				t.Errorf("got %v", got)
			}
		})
	}
	if IndexComplete(nil) || !IndexComplete(&atinfra.InfraIndex{}) {
		t.Error("IndexComplete")
	}
}

func tp2(t time.Time) *string { s := formatTime(t); return &s }
