package interop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	indigo "github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/pds/refpds"
)

// shape renders a JSON answer as its sorted keys; the values named in keep are shown too
// (those that must be equal across servers, not only present).
func shape(v any, keep ...string) string {
	raw, _ := json.Marshal(v)
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		return fmt.Sprintf("%T", v)
	}
	var parts []string
	for k, val := range m {
		p := k
		for _, kk := range keep {
			if kk == k {
				p = fmt.Sprintf("%s=%v", k, val)
			}
		}
		parts = append(parts, p)
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, " ") + "}"
}

func observeIndigo(err error) string {
	var ae *indigo.APIError
	if errors.As(err, &ae) {
		return fmt.Sprintf("%d %s %s", ae.StatusCode, ae.Name, ae.Message)
	}
	return "error " + err.Error()
}

// lifecycleScenario drives checkAccountStatus, deactivateAccount and activateAccount with
// indigo's client, and what the rest of the network sees of a deactivated repo, on the PDS
// at url; it returns one line per step and the firehose events about the account.
func lifecycleScenario(ctx context.Context, t *testing.T, url string) ([]string, []string) {
	t.Helper()
	a := newAccount(ctx, t, url, "carol.test", "carol-pw", "carol@example.test")
	did, c, self, anon, add := a.did, a.c, a.self, a.anon, a.add
	if _, err := c.PutRecord(ctx, "app.socialweb.interop", "a", map[string]any{"n": 1}, nil); err != nil {
		t.Fatal(err)
	}
	evs := follow(ctx, t, url)
	get := func(step string, cl *indigo.APIClient, nsid string, params map[string]any, keep ...string) {
		var m map[string]any
		err := cl.Get(ctx, syntax.NSID(nsid), params, &m)
		add(step, m, err, keep...)
	}
	statusKeep := []string{"activated", "validDid", "indexedRecords", "privateStateValues", "expectedBlobs", "importedBlobs"}
	repo := map[string]any{"repo": did, "collection": "app.socialweb.interop", "rkey": "a"}
	serving := func(phase string) {
		get(phase+" repo.getRecord", anon, "com.atproto.repo.getRecord", repo)
		get(phase+" repo.listRecords", anon, "com.atproto.repo.listRecords", map[string]any{"repo": did, "collection": "app.socialweb.interop"})
		// The reference cannot resolve its accounts' DIDs in this setup (a localhost PDS
		// endpoint), so describeRepo is compared only where it refuses before resolving.
		if phase == "deactivated" {
			get(phase+" repo.describeRepo", anon, "com.atproto.repo.describeRepo", map[string]any{"repo": did})
		}
		get(phase+" sync.getRepoStatus", anon, "com.atproto.sync.getRepoStatus", map[string]any{"did": did}, "active", "status")
		get(phase+" sync.getLatestCommit", anon, "com.atproto.sync.getLatestCommit", map[string]any{"did": did})
		get(phase+" sync.getLatestCommit (self)", self, "com.atproto.sync.getLatestCommit", map[string]any{"did": did})
		get(phase+" sync.listBlobs", anon, "com.atproto.sync.listBlobs", map[string]any{"did": did})
		_, err := comatproto.SyncGetRepo(ctx, anon, did, "")
		add(phase+" sync.getRepo", "car", err)
		_, err = comatproto.SyncGetRepo(ctx, self, did, "")
		add(phase+" sync.getRepo (self)", "car", err)
		_, err = comatproto.SyncGetRecord(ctx, anon, "app.socialweb.interop", did, "a")
		add(phase+" sync.getRecord", "car", err)
		var ses map[string]any
		err = self.Get(ctx, "com.atproto.server.getSession", nil, &ses)
		add(phase+" server.getSession", map[string]any{"active": ses["active"], "status": ses["status"]}, err, "active", "status")
		_, err = c.PutRecord(ctx, "app.socialweb.interop", "b"+phase, map[string]any{"n": 2}, nil)
		a.note(phase + " repo.putRecord: " + observe(err))
	}

	get("checkAccountStatus (anonymous)", anon, "com.atproto.server.checkAccountStatus", nil)
	get("checkAccountStatus", self, "com.atproto.server.checkAccountStatus", nil, statusKeep...)
	serving("active")
	add("deactivateAccount", nil, comatproto.ServerDeactivateAccount(ctx, self, &comatproto.ServerDeactivateAccount_Input{}))
	get("checkAccountStatus (deactivated)", self, "com.atproto.server.checkAccountStatus", nil, statusKeep...)
	serving("deactivated")
	add("deactivateAccount (again)", nil, comatproto.ServerDeactivateAccount(ctx, self, &comatproto.ServerDeactivateAccount_Input{}))
	add("activateAccount (anonymous)", nil, comatproto.ServerActivateAccount(ctx, anon))
	add("activateAccount", nil, comatproto.ServerActivateAccount(ctx, self))
	add("activateAccount (again)", nil, comatproto.ServerActivateAccount(ctx, self))
	get("checkAccountStatus (active)", self, "com.atproto.server.checkAccountStatus", nil, statusKeep...)
	serving("reactivated")

	// The account's events after its creation (#identity, #account, #commit, #sync) and
	// the first record's #commit.
	return a.out, evs.lines(did, 17, nil)
}

func eventLine(ev *firehose.Event) string {
	switch {
	case ev.Account != nil:
		st := ""
		if ev.Account.Status != nil {
			st = " status=" + *ev.Account.Status
		}
		return fmt.Sprintf("#account active=%v%s", ev.Account.Active, st)
	case ev.Identity != nil:
		h := ""
		if ev.Identity.Handle != nil {
			h = *ev.Identity.Handle
		}
		return "#identity handle=" + h
	case ev.Sync != nil:
		return "#sync"
	case ev.Commit != nil:
		return fmt.Sprintf("#commit ops=%d", len(ev.Commit.Ops))
	}
	return ev.Type
}

// handleScenario drives updateHandle with indigo's client through the reference's handle
// rules (external domains are left out: they would be resolved through DNS).
func handleScenario(ctx context.Context, t *testing.T, url string) ([]string, []string) {
	t.Helper()
	a := newAccount(ctx, t, url, "gina.test", "gina-pw", "gina@example.test")
	did, self, anon, add := a.did, a.self, a.anon, a.add
	if _, err := atclient.New(url).CreateAccount(ctx, "hank.test", "hank-pw", "hank@example.test"); err != nil {
		t.Fatal(err)
	}
	evs := follow(ctx, t, url)
	update := func(cl *indigo.APIClient, h string) {
		add("updateHandle "+h, nil, comatproto.IdentityUpdateHandle(ctx, cl, &comatproto.IdentityUpdateHandle_Input{Handle: h}))
	}
	update(anon, "gina2.test")
	add("updateHandle without handle", nil, self.Post(ctx, "com.atproto.identity.updateHandle", map[string]any{}, nil))
	for _, h := range []string{"not a handle", "gina.invalid", "gi.test", "admin.test", "a.b.test",
		"abcdefghijklmnopqrstuvwxyz.test", "hank.test", "HANK.test", "gina.test", "Gina2.test", "gina2.test"} {
		update(self, h)
	}
	for _, h := range []string{"gina.test", "gina2.test"} {
		var m map[string]any
		err := anon.Get(ctx, "com.atproto.identity.resolveHandle", map[string]any{"handle": h}, &m)
		add("resolveHandle "+h, m, err)
	}
	var m map[string]any
	err := self.Get(ctx, "com.atproto.server.getSession", nil, &m)
	add("getSession", map[string]any{"handle": m["handle"]}, err, "handle")
	_, err = atclient.New(url).CreateAccount(ctx, "admin.test", "admin-pw", "admin@example.test")
	a.note("createAccount admin.test: " + observe(err))
	return a.out, evs.lines(did, 4, func(ev *firehose.Event) bool { return ev.Identity != nil })
}

func TestInteropAccountLifecycle(t *testing.T) {
	peer := refpds.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ours := startOurs(t)
	for _, sc := range []struct {
		name string
		run  func(context.Context, *testing.T, string) ([]string, []string)
	}{{"deactivate", lifecycleScenario}, {"handle", handleScenario}} {
		t.Run(sc.name, func(t *testing.T) {
			want, wantFire := sc.run(ctx, t, peer.PDSURL)
			got, gotFire := sc.run(ctx, t, ours.URL())
			compareLines(t, want, got)
			compareLines(t, wantFire, gotFire)
		})
	}
}

func compareLines(t *testing.T, want, got []string) {
	t.Helper()
	for i := range max(len(want), len(got)) {
		if w, g := at(want, i), at(got, i); w != g {
			t.Errorf("step %d:\n reference: %s\n ours:      %s", i, w, g)
		}
	}
	if t.Failed() || testing.Verbose() {
		for _, l := range want {
			t.Logf("reference: %s", l)
		}
	}
}
