package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"socialweb.computer/internal/pds"
)

// The public URL and relay flags of `pds serve` and `up` are refused in one line naming the
// flag, with a typed error, before anything is opened or started.
func TestPublicURLFlagsAreCheckedFirst(t *testing.T) {
	for _, tc := range []struct {
		name string
		cmd  func() *cobra.Command
		args []string
		flag string
		want any
	}{
		{"pds serve IP", newPDSCommand, []string{"serve", "--public-url", "https://203.0.113.7"}, "--public-url", new(*pds.PublicURLError)},
		{"pds serve port", newPDSCommand, []string{"serve", "--public-url", "https://pds.example.com:8443"}, "--public-url", new(*pds.PublicURLError)},
		{"pds serve http public", newPDSCommand, []string{"serve", "--public-url", "http://pds.example.com"}, "--public-url", new(*pds.PublicURLError)},
		{"pds serve relay alone", newPDSCommand, []string{"serve", "--relay", "https://relay.example.com"}, "--relay", new(*pds.RelayURLError)},
		{"pds serve wss relay", newPDSCommand, []string{"serve", "--public-url", "https://pds.example.com", "--relay", "wss://relay.example.com"}, "--relay", new(*pds.RelayURLError)},
		{"up IP", newUpCommand, []string{"--pds-public-url", "http://127.0.0.1:2583"}, "--pds-public-url", new(*pds.PublicURLError)},
		{"up relay alone", newUpCommand, []string{"--pds-relay", "https://relay.example.com"}, "--pds-relay", new(*pds.RelayURLError)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			cmd := tc.cmd()
			cmd.SetArgs(append(tc.args, "--data-dir", dir))
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			err := cmd.Execute()
			if err == nil || !errors.As(err, tc.want) || !strings.HasPrefix(err.Error(), tc.flag+": ") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("got %v, want a one-line typed error naming %s", err, tc.flag)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the data dir was made before the flags were checked: %v", err)
			}
		})
	}
}
