package app_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/atclient"
)

// The PDS that up starts validates records of the project's collections and of the standard
// ones (app.bsky, ...) against the shipped lexicons ("valid"), stores others as "unknown", and refuses an invalid record of a
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
	if err != nil || again.DID != acct.DID || acct.Password == "" || again.Password != "" {
		t.Fatalf("second EnsureLocalAccount: %+v, %v; want the same account, its password shown only when made", again, err)
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
	// The standard lexicons are there beside the project's: a Bluesky profile is validated.
	res, err = c.PutRecord(ctx, "app.bsky.actor.profile", "self", map[string]any{"$type": "app.bsky.actor.profile", "displayName": "Owner"}, nil)
	if err != nil || res.ValidationStatus != "valid" {
		t.Errorf("profile record: %+v, %v; want validationStatus valid", res, err)
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

// account.json keeps the handle and DID only, 0600: reading it gives no login. One written by
// an older version with the password in clear is migrated at start: the password is replaced
// (the old one, and sessions opened with it, stop working) and the file no longer holds it.
func TestLocalAccountFileHoldsNoPassword(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv, err := app.StartPDS(ctx, app.PDSOptions{DataDir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	path := filepath.Join(dir, "account.json")
	acct, err := app.EnsureLocalAccount(ctx, srv, dir, app.DefaultHandle)
	if err != nil {
		t.Fatal(err)
	}
	assertNoSecret := func(secret string) {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), secret) || strings.Contains(string(b), "password") {
			t.Fatalf("account.json holds the password: %s", b)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
			t.Fatalf("account.json mode %v, want 0600", fi.Mode().Perm())
		}
	}
	assertNoSecret(acct.Password)

	// An older data dir: another account whose file holds its password, readable by all.
	const oldPW = "old-clear-password"
	did, err := srv.CreateAccount(ctx, "legacy.test", oldPW)
	if err != nil {
		t.Fatal(err)
	}
	old := atclient.New(srv.URL())
	if _, err := old.Login(ctx, "legacy.test", oldPW); err != nil {
		t.Fatal(err)
	}
	legacy := t.TempDir()
	path = filepath.Join(legacy, "account.json")
	if err := os.WriteFile(path, []byte(`{"handle":"legacy.test","did":"`+did+`","password":"`+oldPW+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := app.EnsureLocalAccount(ctx, srv, legacy, "legacy.test")
	if err != nil || got.DID != did || !got.Migrated || got.Password == "" || got.Password == oldPW {
		t.Fatalf("migration: %+v %v", got, err)
	}
	assertNoSecret(oldPW)
	assertNoSecret(got.Password)
	if _, err := atclient.New(srv.URL()).Login(ctx, "legacy.test", oldPW); !atclient.IsXRPC(err, "AuthenticationRequired") {
		t.Fatalf("the password that was in clear still logs in: %v", err)
	}
	if err := old.Refresh(ctx); err == nil {
		t.Fatal("a session opened with the password that was in clear still refreshes")
	}
	if _, err := atclient.New(srv.URL()).Login(ctx, "legacy.test", got.Password); err != nil {
		t.Fatalf("the new password: %v", err)
	}
	again, err := app.EnsureLocalAccount(ctx, srv, legacy, "legacy.test")
	if err != nil || again.Migrated || again.Password != "" || again.DID != did {
		t.Fatalf("start after the migration: %+v %v", again, err)
	}
}
