package pds_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	indigo "github.com/bluesky-social/indigo/atproto/atclient"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/pds"
)

func apiErrName(err error) string {
	var ae *indigo.APIError
	if errors.As(err, &ae) {
		return fmt.Sprintf("%d %s", ae.StatusCode, ae.Name)
	}
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// accountEvents reads the stored firehose and renders did's #account and #identity events.
func accountEvents(t *testing.T, s *pds.Server, did string, want int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []string
	zero := int64(0)
	err := s.Subscribe(ctx, &zero, func(ev *firehose.Event) error {
		if ev.DID() != did {
			return nil
		}
		switch {
		case ev.Account != nil:
			st := ""
			if ev.Account.Status != nil {
				st = "/" + *ev.Account.Status
			}
			out = append(out, fmt.Sprintf("account:%v%s", ev.Account.Active, st))
		default:
			out = append(out, ev.Type)
		}
		if len(out) == want {
			return errors.New("done")
		}
		return nil
	})
	if err == nil || err.Error() != "done" {
		t.Fatalf("firehose: %v (got %v)", err, out)
	}
	return out
}

func TestDeactivateActivate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := startPDS(t, dir)
	did, err := s.CreateAccount(ctx, "dora.test", "pw")
	if err != nil {
		t.Fatal(err)
	}
	c := atclient.New(s.URL())
	ses, err := c.Login(ctx, "dora.test", "pw")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutRecord(ctx, "app.socialweb.test", "a", map[string]any{"n": 1}, nil); err != nil {
		t.Fatal(err)
	}
	self := indigo.NewAPIClient(s.URL())
	self.Headers.Set("Authorization", "Bearer "+ses.AccessJwt)
	anon := indigo.NewAPIClient(s.URL())

	st, err := comatproto.ServerCheckAccountStatus(ctx, self)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Activated || !st.ValidDid || st.IndexedRecords != 1 || st.RepoBlocks == 0 || st.RepoRev == "" {
		t.Fatalf("checkAccountStatus: %+v", st)
	}
	if _, err := comatproto.ServerCheckAccountStatus(ctx, anon); apiErrName(err) != "401 AuthMissing" {
		t.Fatalf("anonymous checkAccountStatus: %v", err)
	}

	if err := comatproto.ServerDeactivateAccount(ctx, self, &comatproto.ServerDeactivateAccount_Input{}); err != nil {
		t.Fatal(err)
	}
	refused := map[string]error{}
	_, refused["sync.getRepo"] = comatproto.SyncGetRepo(ctx, anon, did, "")
	_, refused["sync.getRecord"] = comatproto.SyncGetRecord(ctx, anon, "app.socialweb.test", did, "a")
	_, refused["sync.getLatestCommit"] = comatproto.SyncGetLatestCommit(ctx, anon, did)
	_, refused["repo.describeRepo"] = comatproto.RepoDescribeRepo(ctx, anon, did)
	for name, err := range refused {
		if apiErrName(err) != "400 RepoDeactivated" {
			t.Errorf("%s of a deactivated repo: %v", name, err)
		}
	}
	if _, err := comatproto.RepoGetRecord(ctx, anon, "", "app.socialweb.test", did, "a"); apiErrName(err) != "400 InvalidRequest" {
		t.Errorf("repo.getRecord of a deactivated repo: %v", err)
	}
	if _, err := comatproto.SyncGetRepo(ctx, self, did, ""); err != nil {
		t.Errorf("the account's own getRepo: %v", err)
	}
	if _, err := c.PutRecord(ctx, "app.socialweb.test", "b", map[string]any{"n": 2}, nil); !atclient.IsXRPC(err, "AccountDeactivated") {
		t.Errorf("write while deactivated: %v", err)
	}
	rs, err := comatproto.SyncGetRepoStatus(ctx, anon, did)
	if err != nil || rs.Active || rs.Status == nil || *rs.Status != pds.StatusDeactivated || rs.Rev != nil {
		t.Fatalf("getRepoStatus: %+v %v", rs, err)
	}

	// Deactivation survives a restart.
	s.Close()
	s = startPDS(t, dir)
	defer s.Close()
	self.Host, anon.Host = s.URL(), s.URL()
	if st, err := comatproto.ServerCheckAccountStatus(ctx, self); err != nil || st.Activated || !st.ValidDid {
		t.Fatalf("after restart: %+v %v", st, err)
	}
	if err := comatproto.ServerActivateAccount(ctx, self); err != nil {
		t.Fatal(err)
	}
	if _, err := comatproto.SyncGetRepo(ctx, anon, did, ""); err != nil {
		t.Fatalf("getRepo after activation: %v", err)
	}
	got := strings.Join(accountEvents(t, s, did, 10), " ")
	want := "#identity account:true #commit #sync #commit account:false/deactivated " +
		"#identity account:true #identity #sync"
	// The #identity between deactivation and activation is the restart's new PDS endpoint.
	if got != want {
		t.Fatalf("events:\n got  %s\n want %s", got, want)
	}
}

// identityHandles reads the handles of did's first n #identity events.
func identityHandles(t *testing.T, s *pds.Server, did string, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []string
	zero := int64(0)
	err := s.Subscribe(ctx, &zero, func(ev *firehose.Event) error {
		if ev.Identity != nil && ev.Identity.Did == did && ev.Identity.Handle != nil {
			out = append(out, *ev.Identity.Handle)
		}
		if len(out) == n {
			return errors.New("done")
		}
		return nil
	})
	if err == nil || err.Error() != "done" {
		t.Fatalf("firehose: %v (got %v)", err, out)
	}
	return out
}
