package infra

import (
	"fmt"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// RkeySelf is the record key of the account's index in computer.socialweb.infra; it is never a deployment.
const RkeySelf = "self"

// MaxSuccessors is the last n of a successor rkey (<name>-<uid8>-<n>).
const MaxSuccessors = 64

const maxRecordKeyLen = 512

// RecordKey is a valid atproto record key.
type RecordKey string

// ParseRecordKey checks the atproto record-key syntax (syntax.ParseRecordKey): 1 to 512
// characters of A-Z a-z 0-9 . - _ : ~, and neither "." nor "..".
func ParseRecordKey(s string) (RecordKey, error) {
	if _, err := syntax.ParseRecordKey(s); err != nil {
		return "", fmt.Errorf("record key %q: want 1 to %d characters of A-Z a-z 0-9 . - _ : ~, and not \".\" or \"..\"", s, maxRecordKeyLen)
	}
	return RecordKey(s), nil
}

// ValidRecordKey reports whether s is a valid atproto record key.
func ValidRecordKey(s string) bool {
	_, err := ParseRecordKey(s)
	return err == nil
}

// uid8 is the first 8 hex digits of an object uid (dashes skipped, lower case).
func uid8(uid string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(uid) && b.Len() < 8; i++ {
		c := uid[i]
		switch {
		case c == '-':
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
			b.WriteByte(c)
		case c >= 'A' && c <= 'F':
			b.WriteByte(c + 'a' - 'A')
		default:
			return "", false
		}
	}
	return b.String(), b.Len() == 8
}

// Successor is the n-th record key a publishing object named name (with metadata.uid uid)
// may take: n = 0 is name, n = 1 is name-<uid8>, n = 2..MaxSuccessors is name-<uid8>-<n>,
// where uid8 is the first 8 hex digits of the uid. ok is false past MaxSuccessors, for an
// empty name, for a uid without 8 hex digits (n >= 1) or when the key would be invalid.
func Successor(name, uid string, n int) (rkey string, ok bool) {
	if name == "" || n < 0 || n > MaxSuccessors {
		return "", false
	}
	if n == 0 {
		rkey = name
	} else {
		u, ok := uid8(uid)
		if !ok {
			return "", false
		}
		rkey = name + "-" + u
		if n >= 2 {
			rkey += "-" + itoa(n)
		}
	}
	return rkey, ValidRecordKey(rkey)
}

// SuccessorIndex is the n for which Successor(name, uid, n) is rkey; ok is false when rkey is
// not in the succession.
func SuccessorIndex(name, uid, rkey string) (int, bool) {
	if rkey == name && name != "" {
		return 0, true
	}
	first, ok := Successor(name, uid, 1)
	if !ok {
		return 0, false
	}
	if rkey == first {
		return 1, true
	}
	rest, found := strings.CutPrefix(rkey, first+"-")
	if !found || rest == "" || rest[0] == '0' || len(rest) > 2 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(rest); i++ {
		if rest[i] < '0' || rest[i] > '9' {
			return 0, false
		}
		n = n*10 + int(rest[i]-'0')
	}
	if n < 2 || n > MaxSuccessors {
		return 0, false
	}
	return n, true
}

// InSuccession reports whether rkey is one of the successor rkeys of name and uid; a stored
// URI stays bound while its rkey is.
func InSuccession(name, uid, rkey string) bool {
	_, ok := SuccessorIndex(name, uid, rkey)
	return ok
}

// MustMoveOn reports whether a fresh bind may not take rkey: it is self, or the record there
// has ended or is past its TTL.
func MustMoveOn(rkey string, at RecordRead, now time.Time) bool {
	if rkey == RkeySelf {
		return true
	}
	if !at.Found {
		return false
	}
	return at.Ended || (at.ExpiresAt != nil && !now.Before(*at.ExpiresAt))
}

// NextRkey is the record key a fresh bind of a publishing object takes, one step at a time:
// with current empty it is the first successor (the name); when the record read at current
// (at) says the key is taken for good (MustMoveOn) it is the successor after current;
// otherwise it is current. The reconciler reads the record at the answer and calls again
// until the answer stays. ok is false when the succession is exhausted.
func NextRkey(name, uid, current string, at RecordRead, now time.Time) (rkey string, ok bool) {
	if current == "" {
		return Successor(name, uid, 0)
	}
	if !MustMoveOn(current, at, now) {
		return current, true
	}
	n, in := SuccessorIndex(name, uid, current)
	if !in {
		return Successor(name, uid, 0)
	}
	for n++; n <= MaxSuccessors; n++ {
		if r, ok := Successor(name, uid, n); ok && r != RkeySelf {
			return r, true
		}
	}
	return "", false
}
