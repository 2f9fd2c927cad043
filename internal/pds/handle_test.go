package pds_test

import (
	"context"
	"strings"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	indigo "github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"socialweb.computer/internal/atclient"
)

func TestUpdateHandle(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := startPDS(t, dir)
	did, err := s.CreateAccount(ctx, "ivy.test", "pw")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateAccount(ctx, "jay.test", "pw"); err != nil {
		t.Fatal(err)
	}
	ses, err := atclient.New(s.URL()).Login(ctx, "ivy.test", "pw")
	if err != nil {
		t.Fatal(err)
	}
	self := indigo.NewAPIClient(s.URL())
	self.Headers.Set("Authorization", "Bearer "+ses.AccessJwt)
	if err := comatproto.IdentityUpdateHandle(ctx, self, &comatproto.IdentityUpdateHandle_Input{Handle: "Jay.test"}); apiErrName(err) != "400 HandleNotAvailable" {
		t.Fatalf("taken handle: %v", err)
	}
	if err := comatproto.IdentityUpdateHandle(ctx, self, &comatproto.IdentityUpdateHandle_Input{Handle: "Ivy2.test"}); err != nil {
		t.Fatal(err)
	}
	// The DID document names the new handle; the old one no longer resolves.
	ident, err := s.Directory().LookupDID(ctx, syntax.DID(did))
	if err != nil {
		t.Fatal(err)
	}
	if h, err := ident.DeclaredHandle(); err != nil || h.String() != "ivy2.test" {
		t.Fatalf("DID document handle: %v %v", h, err)
	}
	s.Close()
	s = startPDS(t, dir)
	defer s.Close()
	anon := indigo.NewAPIClient(s.URL())
	if _, err := comatproto.IdentityResolveHandle(ctx, anon, "ivy.test"); apiErrName(err) != "400 HandleNotFound" {
		t.Fatalf("old handle: %v", err)
	}
	if out, err := comatproto.IdentityResolveHandle(ctx, anon, "ivy2.test"); err != nil || out.Did != did {
		t.Fatalf("new handle: %v %v", out, err)
	}
	if got := strings.Join(accountEvents(t, s, did, 4), " "); got != "#identity account:true #commit #sync" {
		t.Fatalf("events: %s", got)
	}
	ev := identityHandles(t, s, did, 2)
	if ev[1] != "ivy2.test" {
		t.Fatalf("#identity handles: %v", ev)
	}
}
