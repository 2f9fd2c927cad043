package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// vmRSS is the resident set of process pid in bytes (VmRSS of /proc/PID/status: anonymous,
// file-backed and shared memory together).
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	return procStatusBytes(t, pid, "VmRSS:")
}

// procStatusBytes is a field of /proc/PID/status given in kB, in bytes.
func procStatusBytes(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", l, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// unsized hides a body's length from net/http, which then sends it chunked: the server
// learns it is too large only by reading it.
type unsized struct{ io.Reader }

// A burst of large requests that up refuses (bodies past the API server's and the PDS's
// limits, declared or chunked; bad JSON; objects the schema refuses, in JSON and YAML) leaves
// up's resident memory within 20% of what it held idle once the burst is over. Before, the
// runtime kept the heap such a burst grew to: this row's burst left up at 181-195 MiB a
// minute later against 110 MiB idle (docs/ARCHITECTURE.md, "Memory after a burst").
// Serial: the figure is of an otherwise quiet machine.
func TestUp_MemoryReturnsAfterBurstOfRefusedRequests(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir)
	pid := up.cmd.Process.Pid
	pdsURL := up.phase(t, "PDS serving at ")
	acct := localAccount(t, up)
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	api, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pds := &http.Client{Timeout: 2 * time.Minute}
	b, _ := json.Marshal(map[string]string{"identifier": acct.Handle, "password": acct.Password})
	resp, err := pds.Post(pdsURL+"/xrpc/com.atproto.server.createSession", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var session struct{ AccessJwt string }
	_ = json.NewDecoder(resp.Body).Decode(&session)
	resp.Body.Close()
	if session.AccessJwt == "" {
		t.Fatalf("createSession: %s, no token", resp.Status)
	}

	// Idle: what up holds a few seconds after ready, once its start-up heap is handed back.
	time.Sleep(10 * time.Second)
	idle := vmRSS(t, pid)

	type request struct {
		name  string
		hc    *http.Client
		url   string
		ctype string
		body  func() io.Reader
		want  int
		times int
	}
	record := func(n int) string {
		return `{"repo":"` + acct.DID + `","collection":"app.bsky.feed.post","record":{"text":"` + strings.Repeat("x", n) + `"}}`
	}
	secret := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"big"},"data":{"x":"` + strings.Repeat("QUFB", 1<<20) + `"}}`
	infra := `{"apiVersion":"socialweb.computer/v1alpha1","kind":"Infra","metadata":{"generateName":"big-"},"spec":{"contracts":[{"name":"web","state":"Requested","computeKind":"deno","userData":"` +
		strings.Repeat("a", 1400000) + `"}]}}`
	manyYAML := "apiVersion: socialweb.computer/v1alpha1\nkind: Infra\nmetadata:\n  generateName: many-\nspec:\n  contracts:\n" +
		strings.Repeat("  - name: web\n    state: Requested\n    computeKind: deno\n", 20000)
	badJSON := `{"apiVersion":"socialweb.computer/v1alpha1","kind":"Infra","spec":[` + strings.Repeat("1,", 700000)
	const secrets = "/api/v1/namespaces/default/secrets"
	infras := cfg.Host + "/apis/socialweb.computer/v1alpha1/namespaces/default/infras"
	createRecord := pdsURL + "/xrpc/com.atproto.repo.createRecord"
	reqs := []request{
		{"API: 4 MiB Secret", api, cfg.Host + secrets, "application/json", func() io.Reader { return strings.NewReader(secret) }, 413, 20},
		{"API: 4 MiB Secret, chunked", api, cfg.Host + secrets, "application/json", func() io.Reader { return unsized{strings.NewReader(secret)} }, 413, 20},
		{"API: 1.4 MB of bad JSON", api, infras, "application/json", func() io.Reader { return strings.NewReader(badJSON) }, 400, 20},
		{"API: Infra with 1.4 MB of userData", api, infras, "application/json", func() io.Reader { return strings.NewReader(infra) }, 422, 20},
		{"API: Infra of 20000 contracts, YAML", api, infras, "application/yaml", func() io.Reader { return strings.NewReader(manyYAML) }, 422, 6},
		{"PDS: 4 MiB record", pds, createRecord, "application/json", func() io.Reader { return strings.NewReader(record(4 << 20)) }, 413, 20},
		{"PDS: 4 MiB record, chunked", pds, createRecord, "application/json", func() io.Reader { return unsized{strings.NewReader(record(4 << 20))} }, 413, 20},
		{"PDS: 1 MB of bad JSON", pds, createRecord, "application/json", func() io.Reader { return strings.NewReader(`{"repo":[` + strings.Repeat("1,", 500000)) }, 400, 20},
		{"PDS: 6 MiB blob, chunked", pds, pdsURL + "/xrpc/com.atproto.repo.uploadBlob", "application/octet-stream",
			func() io.Reader { return unsized{bytes.NewReader(make([]byte, 6<<20))} }, 413, 20},
	}
	work := make(chan request)
	var mu sync.Mutex
	got := map[string]map[int]int{}
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range work {
				req, err := http.NewRequest(http.MethodPost, r.url, r.body())
				if err != nil {
					t.Error(err)
					continue
				}
				req.Header.Set("Content-Type", r.ctype)
				if r.hc == pds {
					req.Header.Set("Authorization", "Bearer "+session.AccessJwt)
				}
				code := 0
				if resp, err := r.hc.Do(req); err == nil {
					code = resp.StatusCode
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				mu.Lock()
				if got[r.name] == nil {
					got[r.name] = map[int]int{}
				}
				got[r.name][code]++
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	for i := range 20 {
		for _, r := range reqs {
			if i < r.times {
				work <- r
			}
		}
	}
	close(work)
	wg.Wait()
	end := time.Now()
	after := vmRSS(t, pid)
	t.Logf("burst of %d kinds took %s: RSS idle %d MiB, after the burst %d MiB, peak of the process %d MiB", len(reqs),
		end.Sub(start).Round(time.Millisecond), idle>>20, after>>20, procStatusBytes(t, pid, "VmHWM:")>>20)
	for _, r := range reqs {
		// Every request is refused as it should be: a refusal answered otherwise (a 5xx,
		// a dropped connection) would be a bug of its own.
		if g := got[r.name]; g[r.want] != r.times {
			t.Errorf("%s: answers %v, want %d x %d", r.name, g, r.times, r.want)
		}
	}

	// A bound on memory, not on time: the minute only keeps a failing row from hanging.
	limit := idle + idle/5
	deadline := time.Now().Add(time.Minute)
	var now int64
	for {
		now = vmRSS(t, pid)
		if now <= limit || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	t.Logf("RSS %d MiB %s after the burst (idle %d MiB, limit %d MiB)", now>>20, time.Since(end).Round(time.Second), idle>>20, limit>>20)
	if now > limit {
		t.Errorf("RSS %d MiB a minute after a burst of refused requests, more than 20%% over idle %d MiB", now>>20, idle>>20)
	}
	// Still serving.
	if _, err := pds.Get(pdsURL + "/xrpc/_health"); err != nil {
		t.Errorf("PDS after the burst: %v", err)
	}
}
