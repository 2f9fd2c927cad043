package main

import (
	"bytes"
	"testing"
)

// After Close, what the manager's goroutines still log is dropped: the error that ended the
// controllers stays the last line.
func TestClosableWriterDropsWritesAfterClose(t *testing.T) {
	var b bytes.Buffer
	w := &closableWriter{w: &b}
	if n, err := w.Write([]byte("before\n")); n != 7 || err != nil {
		t.Fatalf("write before close: %d %v", n, err)
	}
	w.Close()
	if n, err := w.Write([]byte("after\n")); n != 6 || err != nil {
		t.Fatalf("write after close: %d %v, want it taken and dropped", n, err)
	}
	if b.String() != "before\n" {
		t.Fatalf("written %q, want only what came before Close", b.String())
	}
}
