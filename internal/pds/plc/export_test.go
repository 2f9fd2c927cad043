package plc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// dump pages through /export the way goat's `plc dump` does: count per page, after = the last
// line's createdAt, until an empty page. It returns every line.
func dump(t *testing.T, base string, count int) []Entry {
	t.Helper()
	var out []Entry
	after := ""
	for page := 0; page < 100; page++ {
		q := url.Values{"count": {fmt.Sprint(count)}}
		if after != "" {
			q.Set("after", after)
		}
		resp, err := http.Get(base + "/export?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/jsonlines" {
			t.Fatalf("export: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		if len(body) == 0 {
			return out
		}
		if strings.HasSuffix(string(body), "\n") {
			t.Fatalf("export page ends with a newline: %q", body)
		}
		lines := strings.Split(string(body), "\n")
		if len(lines) > count {
			t.Fatalf("page of %d lines for count %d", len(lines), count)
		}
		for _, l := range lines {
			var raw map[string]any
			if err := json.Unmarshal([]byte(l), &raw); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			for _, k := range []string{"did", "operation", "cid", "nullified", "createdAt"} {
				if _, ok := raw[k]; !ok {
					t.Fatalf("line lacks %s: %s", k, l)
				}
			}
			var e Entry
			if err := json.Unmarshal([]byte(l), &e); err != nil {
				t.Fatal(err)
			}
			out = append(out, e)
			after = raw["createdAt"].(string)
		}
	}
	t.Fatal("export did not end")
	return nil
}

func TestPLCExportPagesEveryOperationOnce(t *testing.T) {
	ctx := context.Background()
	dir, err := Open(filepath.Join(t.TempDir(), "plc.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	srv := httptest.NewServer(dir.Handler())
	defer srv.Close()

	// Three DIDs, two operations each, submitted faster than a millisecond apart.
	var want []string
	for i := range 3 {
		rot, rotDID := newKey(t)
		_, sigDID := newKey(t)
		did, op, err := Genesis(rot, []string{rotDID}, sigDID, fmt.Sprintf("u%d.test", i), "http://127.0.0.1:1")
		if err != nil {
			t.Fatal(err)
		}
		next, err := Next(rot, op, Op{RotationKeys: []string{rotDID}, AlsoKnownAs: []string{"at://v.test"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range []*Op{op, next} {
			if err := dir.Submit(ctx, did, o); err != nil {
				t.Fatal(err)
			}
			c, _ := o.CID()
			want = append(want, did+" "+c.String())
		}
	}
	for _, count := range []int{1, 2, 4, 1000} {
		got := dump(t, srv.URL, count)
		var ids []string
		for i, e := range got {
			ids = append(ids, e.DID+" "+e.CID)
			if i > 0 && !e.CreatedAt.After(got[i-1].CreatedAt) {
				t.Fatalf("count %d: createdAt not increasing at %d: %v", count, i, e.CreatedAt)
			}
		}
		if strings.Join(ids, "\n") != strings.Join(want, "\n") {
			t.Fatalf("count %d: exported\n%s\nwant\n%s", count, strings.Join(ids, "\n"), strings.Join(want, "\n"))
		}
	}
	// The createdAt of the export is the audit log's.
	audit, err := dir.AuditLog(ctx, strings.Fields(want[0])[0])
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(audit[0])
	if !strings.Contains(string(raw), `"createdAt":"`+audit[0].CreatedAt.Format(TimeFormat)+`"`) {
		t.Fatalf("audit entry %s", raw)
	}

	for _, q := range []string{"count=0", "count=x", "after=yesterday"} {
		resp, err := http.Get(srv.URL + "/export?" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Fatalf("%s: %d", q, resp.StatusCode)
		}
	}
	// A cursor after everything is an empty page.
	resp, err := http.Get(srv.URL + "/export?after=" + url.QueryEscape(time.Now().Add(time.Hour).UTC().Format(TimeFormat)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(body) != 0 {
		t.Fatalf("after the end: %d %q", resp.StatusCode, body)
	}
}

// A directory written before /export existed is indexed at open, and operations that shared a
// timestamp get distinct ones.
func TestPLCExportIndexesOldDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "plc.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	var dids []string
	err = db.Update(func(tx *bolt.Tx) error {
		logs, err := tx.CreateBucket(bucketLog)
		if err != nil {
			return err
		}
		for i := range 3 {
			rot, rotDID := newKey(t)
			did, op, err := Genesis(rot, []string{rotDID}, rotDID, fmt.Sprintf("o%d.test", i), "http://x")
			if err != nil {
				return err
			}
			dids = append(dids, did)
			sub, err := logs.CreateBucket([]byte(did))
			if err != nil {
				return err
			}
			c, _ := op.CID()
			raw, _ := json.Marshal(map[string]any{"did": did, "operation": op, "cid": c.String(), "nullified": false,
				"createdAt": at.Add(-time.Duration(i) * time.Nanosecond)})
			if err := sub.Put(seqKey(1), raw); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	dir, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	srv := httptest.NewServer(dir.Handler())
	defer srv.Close()
	got := dump(t, srv.URL, 1)
	if len(got) != 3 || got[0].DID != dids[2] || got[1].DID != dids[1] || got[2].DID != dids[0] {
		t.Fatalf("exported %+v", got)
	}
	if got[0].CreatedAt.Equal(got[1].CreatedAt) || got[1].CreatedAt.Equal(got[2].CreatedAt) {
		t.Fatalf("shared createdAt: %v", got)
	}
	audit, err := dir.AuditLog(context.Background(), dids[0])
	if err != nil || !audit[0].CreatedAt.Equal(got[2].CreatedAt) {
		t.Fatalf("audit log %v %v", audit, err)
	}
}
