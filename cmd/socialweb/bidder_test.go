package main

import (
	"errors"
	"testing"
)

func TestNewSubstrateRefusesUnknownKinds(t *testing.T) {
	_, err := newSubstrate("vm", t.TempDir(), "")
	var ue *UnknownSubstrateError
	if !errors.As(err, &ue) || ue.Kind != "vm" {
		t.Fatalf("--substrate vm: %v, want an UnknownSubstrateError", err)
	}
	if _, err := newSubstrate("deno", t.TempDir(), t.TempDir()); err == nil {
		t.Fatal("--substrate deno with --image-dir: no error")
	}
}
