package app_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"testing"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/atclient"
)

// The PDS that up starts validates records of the project's collections against the
// shipped lexicons ("valid"), stores others as "unknown", and refuses an invalid record of a
// known collection with InvalidRequest, writing nothing.
func TestStartPDSValidatesTheProjectsCollections(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv, err := app.StartPDS(ctx, app.PDSOptions{DataDir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	acct, err := app.EnsureLocalAccount(ctx, srv, dir, app.DefaultHandle)
	if err != nil {
		t.Fatal(err)
	}
	again, err := app.EnsureLocalAccount(ctx, srv, dir, app.DefaultHandle)
	if err != nil || again.DID != acct.DID || again.Password != acct.Password {
		t.Fatalf("second EnsureLocalAccount: %+v, %v; want the same account", again, err)
	}
	c := atclient.New(srv.URL())
	if _, err := c.Login(ctx, acct.Handle, acct.Password); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("../../lexicons/testdata/valid/computer.socialweb.infra.json")
	if err != nil {
		t.Fatal(err)
	}
	var infra map[string]any
	if err := json.Unmarshal(raw, &infra); err != nil {
		t.Fatal(err)
	}
	res, err := c.PutRecord(ctx, "computer.socialweb.infra", "build", infra, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ValidationStatus != "valid" {
		t.Errorf("infra record: validationStatus %q, want valid", res.ValidationStatus)
	}
	res, err = c.PutRecord(ctx, "com.example.other", "x", map[string]any{"$type": "com.example.other", "n": 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ValidationStatus != "unknown" {
		t.Errorf("foreign record: validationStatus %q, want unknown", res.ValidationStatus)
	}
	infra["description"] = 42 // the lexicon says string
	_, err = c.PutRecord(ctx, "computer.socialweb.infra", "broken", infra, nil)
	if !atclient.IsXRPC(err, "InvalidRequest") {
		t.Fatalf("invalid infra record: %v, want InvalidRequest", err)
	}
	if _, err := c.GetRecord(ctx, acct.DID, "computer.socialweb.infra", "broken"); !atclient.RecordNotFound(err) {
		t.Errorf("the refused record exists: %v", err)
	}
}
