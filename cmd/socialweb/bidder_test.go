package main

import (
	"errors"
	"testing"

	"socialweb.computer/internal/substrate/node"
)

func TestNewSubstrateRefusesUnknownKinds(t *testing.T) {
	_, err := newSubstrate("vm", t.TempDir(), node.Config{})
	var ue *UnknownSubstrateError
	if !errors.As(err, &ue) || ue.Kind != "vm" {
		t.Fatalf("--substrate vm: %v, want an UnknownSubstrateError", err)
	}
	if _, err := newSubstrate("deno", t.TempDir(), node.Config{ImageDir: t.TempDir()}); err == nil {
		t.Fatal("--substrate deno with --image-dir: no error")
	}
}
