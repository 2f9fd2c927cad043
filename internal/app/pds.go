package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"socialweb.computer/internal/atomicfile"
	"socialweb.computer/internal/pds"
	"socialweb.computer/lexicons"
)

// DefaultHandle is the handle of the local account `up` creates on its first start.
const DefaultHandle = "owner.test"

// LocalAccount is an account an embedded PDS hosts for this process (up's owner account,
// the local bidders'). The process acts as it in-process, by DID (repos.Local), so no
// password is needed to log in again: DATA_DIR/.../account.json keeps the handle and DID
// only, 0600. The password exists in memory when it is made, to be shown once to a person.
type LocalAccount struct {
	Handle string `json:"handle"`
	DID    string `json:"did"`
	// Password is set only by the EnsureLocalAccount call that made it (a new account, or
	// the migration of an account.json that held one); it is never written.
	Password string `json:"-"`
	// Migrated says the password was rotated because an old account.json held it in clear.
	Migrated bool `json:"-"`
}

// accountFile is account.json as written now, and as older versions wrote it (with the
// password in clear), which EnsureLocalAccount migrates.
type accountFile struct {
	Handle   string `json:"handle"`
	DID      string `json:"did"`
	Password string `json:"password,omitempty"`
}

// PDSOptions configure an embedded PDS.
type PDSOptions struct {
	DataDir  string
	Addr     string
	Hostname string
	PLCURL   string
	// PLCListen is where the in-process did:plc directory listens when PLCURL is empty
	// (default 127.0.0.1:0).
	PLCListen string
	// PublicURL is where the world reaches the PDS (pds.ParsePublicURL); its DID documents
	// and service DID name it. Empty: http://<listen address>.
	PublicURL string
	// Relays are asked to crawl the PDS (requestCrawl) at start and after new accounts;
	// they need PublicURL.
	Relays []string
	// OpenSignup lets anyone create an account over XRPC without an invite code; only on a
	// loopback Addr (pds.OpenSignupError otherwise).
	OpenSignup bool
	// AdminPassword opens createInviteCode(s) to HTTP Basic admin:<it>; empty closes them.
	AdminPassword string
	// BlobUploadLimit is the largest blob uploadBlob takes, in bytes; 0: the default (5 MiB).
	BlobUploadLimit int64
	Logger          *slog.Logger
}

// AdminPasswordEnv is the environment variable up and `pds serve` read the PDS's admin
// password from (as the reference PDS reads PDS_ADMIN_PASSWORD).
const AdminPasswordEnv = "SOCIALWEB_PDS_ADMIN_PASSWORD"

// StartPDS starts the PDS with the project's lexicons (over the standard set the PDS embeds),
// so records of our collections and of the standard ones are validated ("valid") and others
// stored as "unknown".
func StartPDS(ctx context.Context, o PDSOptions) (*pds.Server, error) {
	catalog, err := lexicons.Catalog()
	if err != nil {
		return nil, err
	}
	srv, err := pds.New(pds.Config{DataDir: o.DataDir, Addr: o.Addr, Hostname: o.Hostname, PLCURL: o.PLCURL, PLCAddr: o.PLCListen, Lexicons: catalog,
		PublicURL: o.PublicURL, Relays: o.Relays,
		OpenSignup: o.OpenSignup, AdminPassword: o.AdminPassword, BlobUploadLimit: o.BlobUploadLimit, Logger: o.Logger})
	if err != nil {
		return nil, fmt.Errorf("PDS in %s: %w", o.DataDir, err)
	}
	if err := srv.Start(ctx); err != nil {
		return nil, fmt.Errorf("PDS: %w", err)
	}
	return srv, nil
}

// CheckPublicFlags checks a public URL and relay flags before anything starts, so a mistake is
// one line naming the flag.
func CheckPublicFlags(publicFlag, publicURL, relayFlag string, relays []string) error {
	if publicURL != "" {
		if _, err := pds.ParsePublicURL(publicURL); err != nil {
			return fmt.Errorf("--%s: %w", publicFlag, err)
		}
	}
	for _, r := range relays {
		if _, err := pds.ParseRelayURL(r); err != nil {
			return fmt.Errorf("--%s: %w", relayFlag, err)
		}
		if publicURL == "" {
			return fmt.Errorf("--%s: %w", relayFlag, &pds.RelayURLError{URL: r, Reason: "needs --" + publicFlag + ": a relay crawls a PDS by its public host name"})
		}
	}
	return nil
}

// ServingAt says where a PDS is reached, and where it listens when that differs (a public URL
// served by a proxy in front of it).
func ServingAt(srv *pds.Server) string {
	if srv.LocalURL() != srv.URL() {
		return fmt.Sprintf("%s (listening on %s)", srv.URL(), srv.LocalURL())
	}
	return srv.URL()
}

// EnsureLocalAccount returns the account of dataDir/account.json, creating it on the first
// start through the in-process path (no invite code). A new account's password is in the
// returned Password, once. An account.json of an older version that holds the password in
// clear is migrated: the password is replaced (the old one may have been read already),
// its sessions ended, and the file rewritten without it.
func EnsureLocalAccount(ctx context.Context, srv *pds.Server, dataDir, handle string) (*LocalAccount, error) {
	path := filepath.Join(dataDir, "account.json")
	b, err := os.ReadFile(path)
	if err == nil {
		var f accountFile
		if err := json.Unmarshal(b, &f); err != nil || f.DID == "" {
			return nil, fmt.Errorf("%s is corrupt: want {\"handle\", \"did\"} of an account of this PDS", path)
		}
		a := &LocalAccount{Handle: f.Handle, DID: f.DID}
		if f.Password != "" {
			pw, err := randomPassword()
			if err != nil {
				return nil, err
			}
			if err := srv.SetPassword(ctx, f.DID, pw); err != nil {
				return nil, fmt.Errorf("replacing the password %s held in clear: %w", path, err)
			}
			a.Password, a.Migrated = pw, true
		}
		// Rewritten every start: drops a clear password, and makes the mode 0600 whatever an
		// older version or a copy left.
		if err := writeAccountFile(path, a); err != nil {
			return nil, err
		}
		return a, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	pw, err := randomPassword()
	if err != nil {
		return nil, err
	}
	did, err := srv.CreateAccount(ctx, handle, pw)
	if err != nil {
		return nil, fmt.Errorf("creating the local account %s: %w", handle, err)
	}
	a := &LocalAccount{Handle: handle, DID: did, Password: pw}
	if err := writeAccountFile(path, a); err != nil {
		return nil, err
	}
	return a, nil
}

// writeAccountFile writes the handle and DID, 0600, atomically.
func writeAccountFile(path string, a *LocalAccount) error {
	b, _ := json.MarshalIndent(accountFile{Handle: a.Handle, DID: a.DID}, "", "  ")
	return atomicfile.Write(path, b, 0o600)
}
