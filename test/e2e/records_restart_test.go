package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/testenv"
	"socialweb.computer/internal/watch"
)

// changeLog records the changes a broker delivers for one watch.
type changeLog struct {
	mu  sync.Mutex
	all []watch.Change
}

func (l *changeLog) add(c watch.Change) {
	l.mu.Lock()
	l.all = append(l.all, c)
	l.mu.Unlock()
}

func (l *changeLog) list() []watch.Change {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]watch.Change(nil), l.all...)
}

// checkOnceInOrder fails unless the changes are exactly want (action:rkey), in strictly
// increasing seq order: nothing missed, nothing delivered twice.
func checkOnceInOrder(t *testing.T, got []watch.Change, want []string) {
	t.Helper()
	var g []string
	for i, c := range got {
		g = append(g, string(c.Action)+":"+c.RKey)
		if i > 0 && c.Seq <= got[i-1].Seq {
			t.Errorf("seq %d delivered after %d", c.Seq, got[i-1].Seq)
		}
	}
	if fmt.Sprint(g) != fmt.Sprint(want) {
		t.Fatalf("broker delivered %v, want %v", g, want)
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestACC_WatchSurvivesPDSRestart(t *testing.T) {
	ctx := context.Background()
	dir, addr := t.TempDir(), freeAddr(t)
	srv, acct := testenv.StartPDS(t, dir, addr)
	env := testenv.Start(t, testenv.Options{Controllers: true})
	var log changeLog
	defer env.Broker.Subscribe(log.add)()
	remoteRepo(t, env, "remote", srv.URL(), acct.Handle, acct.Password)
	waitRepoReason(t, env, "remote", v1alpha1.ReasonLoggedIn)
	newWatch(t, env, "notes", "remote", noteCollection)

	put := func(rkey, text string) string {
		c := atclient.New(srv.URL())
		if _, err := c.Login(ctx, acct.Handle, acct.Password); err != nil {
			t.Fatal(err)
		}
		res, err := c.PutRecord(ctx, noteCollection, rkey, note(text), nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.CID
	}
	uri := func(rkey string) string { return "at://" + acct.DID + "/" + noteCollection + "/" + rkey }
	put("a", "1")
	cidB := put("b", "1")
	waitWatch(t, env, "notes", "a and b", func(st v1alpha1.AtprotoRecordWatchStatus) bool { return hasRecord(st, uri("b"), cidB) })

	srv.Close()
	time.Sleep(300 * time.Millisecond) // the follower notices the broken stream
	srv, _ = testenv.StartPDS(t, dir, addr)
	put("c", "1")
	cidA := put("a", "2")
	waitWatch(t, env, "notes", "c and the new a after the restart", func(st v1alpha1.AtprotoRecordWatchStatus) bool {
		return hasRecord(st, uri("c"), "") && hasRecord(st, uri("a"), cidA) && len(st.Records) == 3
	})
	// The follower writes its status before it publishes: wait for the publish too.
	testenv.Eventually(t, 10*time.Second, "four changes published", func() (bool, error) { return len(log.list()) >= 4, nil })
	checkOnceInOrder(t, log.list(), []string{"create:a", "create:b", "create:c", "update:a"})
}

func TestACC_WatchSurvivesCoreRestart(t *testing.T) {
	ctx := context.Background()
	srv, acct := testenv.StartPDS(t, t.TempDir(), "")
	dataDir := t.TempDir()
	env := testenv.Start(t, testenv.Options{Controllers: true, DataDir: dataDir, PDSServer: srv})
	env.Account = acct
	localRepo(t, env, "me")
	newWatch(t, env, "notes", "me", noteCollection)
	pr := srv.Repo(acct.DID)
	uri := func(rkey string) string { return "at://" + acct.DID + "/" + noteCollection + "/" + rkey }
	for _, k := range []string{"a", "b", "c"} {
		if _, _, err := pr.Put(ctx, noteCollection, k, note("1"), nil); err != nil {
			t.Fatal(err)
		}
	}
	before := waitWatch(t, env, "notes", "a, b, c", func(st v1alpha1.AtprotoRecordWatchStatus) bool { return len(st.Records) == 3 })
	env.Stop()

	// While the core and the controllers are down, the repo changes.
	if _, _, err := pr.Put(ctx, noteCollection, "d", note("1"), nil); err != nil {
		t.Fatal(err)
	}
	_, upd, err := pr.Put(ctx, noteCollection, "a", note("2"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pr.Delete(ctx, noteCollection, "b", nil); err != nil {
		t.Fatal(err)
	}

	env2 := testenv.Start(t, testenv.Options{DataDir: dataDir, PDSServer: srv})
	var log changeLog
	defer env2.Broker.Subscribe(log.add)()
	env2.StartControllers(t, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	st := waitWatch(t, env2, "notes", "the changes made while down", func(st v1alpha1.AtprotoRecordWatchStatus) bool {
		return hasRecord(st, uri("d"), "") && hasRecord(st, uri("a"), upd.CID) && wasDeleted(st, uri("b")) && !hasRecord(st, uri("b"), "")
	})
	if st.Cursor <= before.Cursor || len(st.Records) != 3 {
		t.Fatalf("status after restart %+v (cursor before %d)", st, before.Cursor)
	}
	time.Sleep(500 * time.Millisecond) // a duplicate would arrive now
	checkOnceInOrder(t, log.list(), []string{"create:d", "update:a", "delete:b"})
	for _, c := range log.list() {
		if c.Seq <= before.Cursor {
			t.Fatalf("change %+v was delivered before the restart already (cursor %d)", c, before.Cursor)
		}
	}
}
