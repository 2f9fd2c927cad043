package infra

import (
	"reflect"
	"sort"
	"time"
	"unicode/utf8"

	atinfra "socialweb.computer/internal/atproto/infra"
)

// Limits of the index at computer.socialweb.infra/self.
const (
	// IndexMaxLive is the most live entries the index holds; past it a collection lists records.
	IndexMaxLive = 256
	// IndexMaxEnded is the most recentEnded entries it keeps, newest first.
	IndexMaxEnded = 32
	// IndexGoneAfter is how long an entry whose record is gone (or an ephemeral entry past its
	// deadline) still counts as live: a record is written after its entry, so a young entry
	// without a record is not gone yet.
	IndexGoneAfter = 10 * time.Minute
	// WriterMaxLen is the longest writer label.
	WriterMaxLen = 64
)

// WriterLabel trims a writer label (core, embedded, gateway:<host>...) to WriterMaxLen bytes,
// on a character boundary.
func WriterLabel(s string) string {
	if len(s) <= WriterMaxLen {
		return s
	}
	n := 0
	for i, r := range s {
		if i+utf8.RuneLen(r) > WriterMaxLen {
			break
		}
		n = i + utf8.RuneLen(r)
	}
	return s[:n]
}

// IndexEntryFor is the live entry of one deployment record.
func IndexEntryFor(kind Kind, rkey string, createdAt time.Time, expiresAt *time.Time, writer string) atinfra.InfraIndexEntry {
	e := atinfra.InfraIndexEntry{Collection: kind.Collection(), Rkey: rkey, Writer: ptrIf(WriterLabel(writer))}
	if !createdAt.IsZero() {
		s := formatTime(createdAt)
		e.CreatedAt = &s
	}
	if kind == KindEphemeralInfra && expiresAt != nil {
		s := formatTime(*expiresAt)
		e.ExpiresAt = &s
	}
	return e
}

// IndexPass is the index after one reconcile of a deployment whose record is at
// (entry.Collection, entry.Rkey): while live the entry is added (addedAt now, when there is
// room) or refreshed (createdAt, expiresAt, writer; addedAt kept); once not live it is
// removed. Ephemeral entries more than IndexGoneAfter past their deadline are dropped on the
// way. changed is false when nothing but updatedAt would differ: then next is index itself
// and the controller writes nothing, so a second identical pass is free. index may be nil
// (no index yet); the input is never modified.
func IndexPass(index *atinfra.InfraIndex, entry atinfra.InfraIndexEntry, live bool, now time.Time) (next *atinfra.InfraIndex, changed bool) {
	cp := copyIndex(index)
	cp.Live = pruneExpired(cp.Live, now)
	i := findLive(cp.Live, entry.Collection, entry.Rkey)
	switch {
	case live && i >= 0:
		e := &cp.Live[i]
		if entry.CreatedAt != nil {
			e.CreatedAt = entry.CreatedAt
		}
		if entry.ExpiresAt != nil {
			e.ExpiresAt = entry.ExpiresAt
		}
		if entry.Writer != nil {
			w := WriterLabel(*entry.Writer)
			e.Writer = &w
		}
	case live && len(cp.Live) < IndexMaxLive:
		e := entry
		if e.Writer != nil {
			w := WriterLabel(*e.Writer)
			e.Writer = &w
		}
		if e.AddedAt == nil {
			s := formatTime(now)
			e.AddedAt = &s
		}
		cp.Live = append(cp.Live, e)
	case !live && i >= 0:
		cp.Live = append(cp.Live[:i], cp.Live[i+1:]...)
	}
	return settleIndex(index, cp, now)
}

// IndexEnd is the index after a deployment ended, was deleted or unbound: its entry leaves
// live and (collection, rkey, endedAt, endReason in the record's words) goes to the front of
// recentEnded, which stays newest first and at most IndexMaxEnded long. Idempotent like
// IndexPass.
func IndexEnd(index *atinfra.InfraIndex, collection, rkey string, endedAt time.Time, reason string, now time.Time) (next *atinfra.InfraIndex, changed bool) {
	cp := copyIndex(index)
	cp.Live = pruneExpired(cp.Live, now)
	if i := findLive(cp.Live, collection, rkey); i >= 0 {
		cp.Live = append(cp.Live[:i], cp.Live[i+1:]...)
	}
	at := formatTime(endedAt)
	e := atinfra.InfraIndexEnded{Collection: collection, Rkey: rkey, EndedAt: &at, EndReason: ptrIf(EndReasonToRecord(reason))}
	ended := []atinfra.InfraIndexEnded{e}
	for _, x := range cp.RecentEnded {
		if x.Collection != collection || x.Rkey != rkey {
			ended = append(ended, x)
		}
	}
	sort.SliceStable(ended, func(i, j int) bool { return endedTime(ended[i]).After(endedTime(ended[j])) })
	if len(ended) > IndexMaxEnded {
		ended = ended[:IndexMaxEnded]
	}
	cp.RecentEnded = ended
	return settleIndex(index, cp, now)
}

// EntryGone says whether a reader (a collection) treats a live entry as gone: its record is
// not found and the entry is older than IndexGoneAfter, or it is an ephemeral entry more than
// IndexGoneAfter past its deadline.
func EntryGone(e atinfra.InfraIndexEntry, recordFound bool, now time.Time) bool {
	if expired(e, now) {
		return true
	}
	if recordFound {
		return false
	}
	added := parseTime(e.AddedAt)
	if added.IsZero() {
		added = parseTime(e.CreatedAt)
	}
	return !now.Before(added.Add(IndexGoneAfter))
}

// IndexComplete says whether a collection may trust the index alone: it exists and is below
// IndexMaxLive. A full index may have left entries out, so the collection pages listRecords
// instead; that is how a collection still enumerates every record past 256.
func IndexComplete(index *atinfra.InfraIndex) bool {
	return index != nil && len(index.Live) < IndexMaxLive
}

func settleIndex(orig, next *atinfra.InfraIndex, now time.Time) (*atinfra.InfraIndex, bool) {
	var before, after [2]any
	if orig != nil {
		before = [2]any{nonNilLive(orig.Live), nonNilEnded(orig.RecentEnded)}
	} else {
		before = [2]any{[]atinfra.InfraIndexEntry{}, []atinfra.InfraIndexEnded{}}
	}
	after = [2]any{nonNilLive(next.Live), nonNilEnded(next.RecentEnded)}
	if orig != nil && reflect.DeepEqual(before, after) {
		return orig, false
	}
	if orig == nil && len(next.Live) == 0 && len(next.RecentEnded) == 0 {
		return nil, false
	}
	next.UpdatedAt = formatTime(now)
	return next, true
}

func nonNilLive(s []atinfra.InfraIndexEntry) []atinfra.InfraIndexEntry {
	if s == nil {
		return []atinfra.InfraIndexEntry{}
	}
	return s
}

func nonNilEnded(s []atinfra.InfraIndexEnded) []atinfra.InfraIndexEnded {
	if s == nil {
		return []atinfra.InfraIndexEnded{}
	}
	return s
}

func copyIndex(index *atinfra.InfraIndex) *atinfra.InfraIndex {
	cp := &atinfra.InfraIndex{}
	if index == nil {
		return cp
	}
	cp.UpdatedAt = index.UpdatedAt
	cp.Live = append([]atinfra.InfraIndexEntry(nil), index.Live...)
	cp.RecentEnded = append([]atinfra.InfraIndexEnded(nil), index.RecentEnded...)
	return cp
}

func findLive(live []atinfra.InfraIndexEntry, collection, rkey string) int {
	for i, e := range live {
		if e.Collection == collection && e.Rkey == rkey {
			return i
		}
	}
	return -1
}

func pruneExpired(live []atinfra.InfraIndexEntry, now time.Time) []atinfra.InfraIndexEntry {
	out := live[:0:0]
	for _, e := range live {
		if !expired(e, now) {
			out = append(out, e)
		}
	}
	return out
}

func expired(e atinfra.InfraIndexEntry, now time.Time) bool {
	t := parseTime(e.ExpiresAt)
	return !t.IsZero() && !now.Before(t.Add(IndexGoneAfter))
}

func endedTime(e atinfra.InfraIndexEnded) time.Time { return parseTime(e.EndedAt) }

func parseTime(s *string) time.Time {
	if s == nil {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, *s)
	if err != nil {
		return time.Time{}
	}
	return t
}
