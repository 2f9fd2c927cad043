package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/spf13/cobra"

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

// A price below zero is refused before the bidder logs in or takes its state dir, naming the
// flag; so is up's for its node bidder, before it opens its data dir.
func TestPriceFlagsRefuseNegatives(t *testing.T) {
	t.Setenv("SOCIALWEB_BIDDER_PASSWORD", "pw")
	for _, c := range []struct {
		cmd  func() *cobra.Command
		args []string
		want string
	}{
		{newBidderCommand, []string{"--pds", "http://127.0.0.1:1", "--identifier", "bidder.test", "--cost-per-cpu", "-1"}, "--cost-per-cpu -1: want 0 or more"},
		{newBidderCommand, []string{"--pds", "http://127.0.0.1:1", "--identifier", "bidder.test", "--cost-per-gib", "-2"}, "--cost-per-gib -2: want 0 or more"},
		{newUpCommand, []string{"--node-cost", "-3"}, "--node-cost -3: want 0 or more"},
		{newUpCommand, []string{"--node-cost-per-cpu", "-4"}, "--node-cost-per-cpu -4: want 0 or more"},
	} {
		dir := t.TempDir()
		cmd := c.cmd()
		flag := "--state-dir"
		if cmd.Name() == "up" {
			flag = "--data-dir"
		}
		cmd.SetArgs(append(c.args, flag, dir))
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %v: %v, want %q", cmd.Name(), c.args, err, c.want)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%s %v: wrote %d entries in %s before refusing", cmd.Name(), c.args, len(ents), dir)
		}
	}
}
