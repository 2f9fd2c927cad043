package infra

import (
	"bufio"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const uid = "0A1B2C3D-4e5f-6789-abcd-ef0123456789"

func lines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

func TestParseRecordKey(t *testing.T) {
	for _, k := range lines(t, "testdata/recordkey_valid.txt") {
		if _, err := ParseRecordKey(k); err != nil {
			t.Errorf("%q: %v", k, err)
		}
	}
	invalid := append(lines(t, "testdata/recordkey_invalid.txt"), "", strings.Repeat("a", 513))
	for _, k := range invalid {
		if ValidRecordKey(k) {
			t.Errorf("%q accepted", k)
		}
	}
	if !ValidRecordKey(strings.Repeat("a", 512)) {
		t.Error("512 characters refused")
	}
}

func TestSuccessor(t *testing.T) {
	type out struct {
		Rkey string
		OK   bool
	}
	tests := []struct {
		name      string
		obj, uid  string
		n         int
		want      out
		wantIndex int
	}{
		{name: "n=0 is the name", obj: "web", uid: uid, n: 0, want: out{"web", true}},
		{name: "n=1 adds the uid8", obj: "web", uid: uid, n: 1, want: out{"web-0a1b2c3d", true}, wantIndex: 1},
		{name: "n=2", obj: "web", uid: uid, n: 2, want: out{"web-0a1b2c3d-2", true}, wantIndex: 2},
		{name: "n=64 is the last", obj: "web", uid: uid, n: 64, want: out{"web-0a1b2c3d-64", true}, wantIndex: 64},
		{name: "n=65 is past the end", obj: "web", uid: uid, n: 65},
		{name: "negative", obj: "web", uid: uid, n: -1},
		{name: "no name", obj: "", uid: uid, n: 0},
		{name: "uid too short", obj: "web", uid: "0a1b", n: 1},
		{name: "uid not hex", obj: "web", uid: "zzzzzzzz", n: 1},
		{name: "name with dots", obj: "web.example", uid: uid, n: 3, want: out{"web.example-0a1b2c3d-3", true}, wantIndex: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := Successor(tc.obj, tc.uid, tc.n)
			if d := cmp.Diff(tc.want, out{r, ok}); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
			if ok {
				n, in := SuccessorIndex(tc.obj, tc.uid, r)
				if !in || n != tc.wantIndex || !InSuccession(tc.obj, tc.uid, r) {
					t.Errorf("SuccessorIndex(%q) = %d, %v", r, n, in)
				}
			}
		})
	}
}

func TestInSuccession(t *testing.T) {
	tests := []struct {
		name string
		rkey string
		want bool
	}{
		{"name", "web", true},
		{"uid8", "web-0a1b2c3d", true},
		{"n", "web-0a1b2c3d-17", true},
		{"n=1 is never written out", "web-0a1b2c3d-1", false},
		{"leading zero", "web-0a1b2c3d-02", false},
		{"past 64", "web-0a1b2c3d-65", false},
		{"another uid", "web-ffffffff", false},
		{"another name", "api", false},
		{"trailing dash", "web-0a1b2c3d-", false},
		{"not a number", "web-0a1b2c3d-x", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := InSuccession("web", uid, tc.rkey); got != tc.want {
				t.Errorf("InSuccession(%q) = %v", tc.rkey, got)
			}
		})
	}
}

func TestNextRkey(t *testing.T) {
	live := RecordRead{Found: true}
	ended := RecordRead{Found: true, Ended: true}
	past := RecordRead{Found: true, ExpiresAt: tp(t0.Add(-time.Second))}
	future := RecordRead{Found: true, ExpiresAt: tp(t0.Add(time.Hour))}
	type out struct {
		Rkey string
		OK   bool
	}
	tests := []struct {
		name    string
		obj     string
		current string
		at      RecordRead
		want    out
	}{
		{name: "fresh bind starts at the name", obj: "web", want: out{"web", true}},
		{name: "absent record: take it", obj: "web", current: "web", want: out{"web", true}},
		{name: "live record: stay (first sync decides)", obj: "web", current: "web", at: live, want: out{"web", true}},
		{name: "ephemeral not yet expired: stay", obj: "web", current: "web", at: future, want: out{"web", true}},
		{name: "ended: move on", obj: "web", current: "web", at: ended, want: out{"web-0a1b2c3d", true}},
		{name: "past its TTL: move on", obj: "web", current: "web", at: past, want: out{"web-0a1b2c3d", true}},
		{name: "from uid8 to 2", obj: "web", current: "web-0a1b2c3d", at: ended, want: out{"web-0a1b2c3d-2", true}},
		{name: "from 9 to 10", obj: "web", current: "web-0a1b2c3d-9", at: ended, want: out{"web-0a1b2c3d-10", true}},
		{name: "exhausted", obj: "web", current: "web-0a1b2c3d-64", at: ended},
		{name: "self is reserved", obj: "self", current: "self", want: out{"self-0a1b2c3d", true}},
		{name: "outside the succession restarts it", obj: "web", current: "other", at: ended, want: out{"web", true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := NextRkey(tc.obj, uid, tc.current, tc.at, t0)
			if d := cmp.Diff(tc.want, out{r, ok}); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}
