package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/firehose"
)

func post(t *testing.T, s *Server, method, authz string, in any) (int, string) {
	t.Helper()
	b, _ := json.Marshal(in)
	req, _ := http.NewRequest("POST", s.URL()+"/xrpc/"+method, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Error string `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out.Error
}

func TestDeleteAccountLeavesNothing(t *testing.T) {
	ctx := context.Background()
	clock := &manualClock{t: time.Now()}
	s := startTestServer(t, clock)
	did, access := testAccount(t, s, "lee.test")
	keep, _ := testAccount(t, s, "max.test")
	blob, err := s.UploadBlob(ctx, did, strings.NewReader("hello"), "text/plain")
	if err != nil {
		t.Fatal(err)
	}
	raw := []byte(`{"b": ` + blobJSON(blob.Ref.String(), blob.MimeType, int(blob.Size)) + `}`)
	if _, _, err := s.Repo(did).Apply(ctx, []Write{{Action: ActionCreate, Collection: "app.socialweb.test", RKey: "a", Raw: raw}}, ""); err != nil {
		t.Fatal(err)
	}

	// Without an email address, requestAccountDelete says so, as the reference.
	if st, name := post(t, s, "com.atproto.server.requestAccountDelete", "Bearer "+access, nil); st != 400 || name != "InvalidRequest" {
		t.Fatalf("requestAccountDelete: %d %s", st, name)
	}
	tok, err := s.RequestAccountDelete(ctx, did)
	if err != nil {
		t.Fatal(err)
	}
	clock.Add(16 * time.Minute)
	if st, name := post(t, s, "com.atproto.server.deleteAccount", "", map[string]any{"did": did, "password": "pw", "token": tok}); st != 400 || name != "ExpiredToken" {
		t.Fatalf("expired token: %d %s", st, name)
	}
	if tok, err = s.RequestAccountDelete(ctx, did); err != nil {
		t.Fatal(err)
	}
	stale, err := s.repoFor(did)
	if err != nil {
		t.Fatal(err)
	}
	if st, name := post(t, s, "com.atproto.server.deleteAccount", "", map[string]any{"did": did, "password": "pw", "token": tok}); st != 200 {
		t.Fatalf("deleteAccount: %d %s", st, name)
	}
	// A writer that took the repo's state before the deletion does not write it back.
	s.reposMu.Lock()
	s.repos[did] = stale
	s.reposMu.Unlock()
	if _, _, err := s.Repo(did).Put(ctx, "app.socialweb.test", "late", map[string]any{"n": 1}, nil); err == nil {
		t.Fatal("a write after the deletion succeeded")
	}
	s.reposMu.Lock()
	delete(s.repos, did)
	s.reposMu.Unlock()

	prefix := repoKey(did, nil)
	err = s.db.View(func(tx *bolt.Tx) error {
		for _, b := range allBuckets {
			c := tx.Bucket(b).Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				if bytes.HasPrefix(k, prefix) || string(k) == did || (string(b) != "events" && bytes.Contains(v, []byte(did))) {
					t.Errorf("bucket %s still holds %q", b, k)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.blobs.Has(ctx, did, cid.Cid(blob.Ref)); err != nil || ok {
		t.Fatalf("blob bytes kept: %v %v", ok, err)
	}
	// The firehose keeps one event of the account: its deletion.
	var evs []string
	zero := int64(0)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_ = s.Subscribe(sctx, &zero, func(ev *firehose.Event) error {
		if ev.DID() == did {
			evs = append(evs, ev.Type)
			if ev.Account == nil || ev.Account.Active || ev.Account.Status == nil || *ev.Account.Status != StatusDeleted {
				t.Errorf("event %+v", ev)
			}
		}
		return nil
	})
	if len(evs) != 1 {
		t.Fatalf("events of the deleted account: %v", evs)
	}
	if _, err := s.Repo(keep).Head(ctx); err != nil {
		t.Fatalf("the other account: %v", err)
	}
}
