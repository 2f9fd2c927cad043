package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"socialweb.computer/internal/pds"
	"socialweb.computer/lexicons"
)

// DefaultHandle is the handle of the local account `up` creates on its first start.
const DefaultHandle = "owner.test"

// LocalAccount is the default account of an embedded PDS, kept 0600 in its data dir so
// that the controllers (and the user) can act as it.
type LocalAccount struct {
	Handle   string `json:"handle"`
	DID      string `json:"did"`
	Password string `json:"password"`
}

// PDSOptions configure an embedded PDS.
type PDSOptions struct {
	DataDir  string
	Addr     string
	Hostname string
	PLCURL   string
	Logger   *slog.Logger
}

// StartPDS starts the PDS with the project's lexicons, so records of our collections are
// validated ("valid") and others stored as "unknown".
func StartPDS(ctx context.Context, o PDSOptions) (*pds.Server, error) {
	catalog, err := lexicons.Catalog()
	if err != nil {
		return nil, err
	}
	srv, err := pds.New(pds.Config{DataDir: o.DataDir, Addr: o.Addr, Hostname: o.Hostname, PLCURL: o.PLCURL, Lexicons: catalog, Logger: o.Logger})
	if err != nil {
		return nil, fmt.Errorf("PDS in %s: %w", o.DataDir, err)
	}
	if err := srv.Start(ctx); err != nil {
		return nil, fmt.Errorf("PDS: %w", err)
	}
	return srv, nil
}

// EnsureLocalAccount returns the default account, creating it on the first start.
func EnsureLocalAccount(ctx context.Context, srv *pds.Server, dataDir, handle string) (*LocalAccount, error) {
	path := filepath.Join(dataDir, "account.json")
	b, err := os.ReadFile(path)
	if err == nil {
		var a LocalAccount
		if err := json.Unmarshal(b, &a); err != nil || a.DID == "" {
			return nil, fmt.Errorf("%s is corrupt; the account's password is lost (the repo is kept)", path)
		}
		return &a, nil
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
	b, _ = json.MarshalIndent(a, "", "  ")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return nil, err
	}
	return a, nil
}
