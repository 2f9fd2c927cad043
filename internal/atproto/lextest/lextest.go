// Package lextest holds test helpers for the generated record packages.
package lextest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Fixtures returns the valid record fixtures of lexicons/testdata/valid whose
// collection starts with prefix, keyed by file name without .json. dir is the
// path of lexicons/testdata/valid from the test's package.
func Fixtures(t *testing.T, dir, prefix string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		name := strings.TrimSuffix(e.Name(), ".json")
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = b
	}
	if len(out) == 0 {
		t.Fatalf("no fixtures for %s in %s", prefix, dir)
	}
	return out
}

// Collection is the collection of a fixture named <collection>[-variant].
func Collection(name string) string {
	c, _, _ := strings.Cut(name, "-")
	return c
}

// SameJSON fails the test unless a and b hold the same JSON value (object key
// order and whitespace aside).
func SameJSON(t *testing.T, a, b []byte) {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("first: %v", err)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("second: %v", err)
	}
	if !reflect.DeepEqual(va, vb) {
		t.Fatalf("JSON differs:\n%s\n%s", a, b)
	}
}

// RoundTrip decodes b into v, encodes v again and checks that the JSON is the
// same, then does it once more from the encoded form.
func RoundTrip(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode: %v", err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	SameJSON(t, b, out)
	fresh := reflect.New(reflect.TypeOf(v).Elem()).Interface()
	if err := json.Unmarshal(out, fresh); err != nil {
		t.Fatalf("decode again: %v", err)
	}
	again, err := json.Marshal(fresh)
	if err != nil {
		t.Fatalf("encode again: %v", err)
	}
	if string(again) != string(out) {
		t.Fatalf("second round trip differs:\n%s\n%s", out, again)
	}
}
