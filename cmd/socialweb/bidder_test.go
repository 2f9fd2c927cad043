package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"socialweb.computer/internal/market/bidder"
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

// A second bidder on a state dir another holds (up's local bidder, by default) is refused
// before it logs in, naming the holder.
func TestBidderRefusesAHeldStateDir(t *testing.T) {
	dir := t.TempDir()
	l, err := bidder.LockStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	t.Setenv("SOCIALWEB_BIDDER_PASSWORD", "pw")
	cmd := newBidderCommand()
	cmd.SetArgs([]string{"--pds", "http://127.0.0.1:1", "--identifier", "bidder.test", "--state-dir", dir})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err = cmd.Execute()
	var held *bidder.StateDirHeldError
	if !errors.As(err, &held) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("bidder on a held state dir: %v, want a StateDirHeldError naming pid %d", err, os.Getpid())
	}
}
