package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/core"
	"socialweb.computer/internal/pds"
)

func newPDSCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "pds", Short: "The embedded atproto PDS and did:plc directory"}
	var o app.PDSOptions
	var dataDir, level, handle, adminPasswordFile string
	serve := &cobra.Command{
		Use:   "serve",
		Short: "Run only the PDS (and its did:plc directory unless --plc-url is given)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := parseLevel(level)
			if err != nil {
				return err
			}
			if err := app.CheckPublicFlags("public-url", o.PublicURL, "relay", o.Relays); err != nil {
				return err
			}
			dir, err := core.OpenDataDir(dataDir)
			if err != nil {
				return err
			}
			defer dir.Close()
			o.DataDir = filepath.Join(dir.Root, "pds")
			o.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: l}))
			o.AdminPassword = os.Getenv(app.AdminPasswordEnv)
			if adminPasswordFile != "" {
				b, err := os.ReadFile(adminPasswordFile)
				if err != nil {
					return fmt.Errorf("--admin-password-file: %w", err)
				}
				o.AdminPassword = strings.TrimSpace(string(b))
			}
			srv, err := app.StartPDS(cmd.Context(), o)
			if err != nil {
				return err
			}
			defer srv.Close()
			acct, err := app.EnsureLocalAccount(cmd.Context(), srv, o.DataDir, handle)
			if err != nil {
				return err
			}
			signup := "sign-up by invite code"
			if o.OpenSignup {
				signup = "sign-up open (no invite code)"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "PDS serving at %s (PLC %s); account %s %s; %s\n",
				app.ServingAt(srv), srv.PLCURL(), acct.Handle, acct.DID, signup)
			switch {
			case acct.Migrated:
				fmt.Fprintf(cmd.OutOrStdout(), "password of %s: %s (replaced: account.json held the old one in clear; shown once, the data dir keeps no copy)\n", acct.Handle, acct.Password)
			case acct.Password != "":
				fmt.Fprintf(cmd.OutOrStdout(), "password of %s: %s (shown once: the data dir keeps no copy)\n", acct.Handle, acct.Password)
			}
			<-cmd.Context().Done()
			return nil
		},
	}
	serve.Flags().StringVar(&dataDir, "data-dir", app.DefaultDataDir()+"-pds", "state directory of this PDS")
	serve.Flags().StringVar(&o.Addr, "listen", "127.0.0.1:0", "listen address (port 0 picks a free one)")
	serve.Flags().StringVar(&o.Hostname, "hostname", "", "public host name; the service DID is did:web:<hostname> (default: the host of --public-url, else localhost)")
	serve.Flags().StringVar(&o.PublicURL, "public-url", "", "URL the world reaches this PDS at, https://<host name> (a proxy in front of --listen): DID documents and the service DID name it; http only for localhost, *.localhost, *.test, *.example, *.invalid (default http://<listen address>)")
	serve.Flags().StringArrayVar(&o.Relays, "relay", nil, "a relay's base URL (https://relay.example.com) asked to crawl this PDS (com.atproto.sync.requestCrawl) at start and after new accounts, repeatable; needs --public-url")
	serve.Flags().StringVar(&o.PLCURL, "plc-url", "", "an external did:plc directory (default: run one in-process)")
	serve.Flags().StringVar(&o.PLCListen, "plc-listen", "127.0.0.1:0", "address of the in-process did:plc directory, when there is one (port 0 picks a free one); it takes operations signed by a DID's rotation keys from anyone reaching it")
	serve.Flags().BoolVar(&o.OpenSignup, "open-signup", false, "let anyone reaching the PDS create an account without an invite code (only with a loopback --listen)")
	serve.Flags().StringVar(&adminPasswordFile, "admin-password-file", "", "file holding the admin password (HTTP Basic user admin) for createInviteCode(s); default $"+app.AdminPasswordEnv+", none: invite codes are not minted over XRPC")
	serve.Flags().Int64Var(&o.BlobUploadLimit, "blob-upload-limit", pds.DefaultBlobUploadLimit, "largest blob com.atproto.repo.uploadBlob takes, in bytes (larger: 413 PayloadTooLarge)")
	serve.Flags().StringVar(&handle, "account", app.DefaultHandle, "handle of the account created on first start")
	serve.Flags().StringVar(&level, "log-level", "info", "log level on stderr: debug, info, warn, error")
	cmd.AddCommand(serve)
	return cmd
}
