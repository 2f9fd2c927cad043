// Package bench compares our PDS with the reference PDS on the same machine: putRecord and
// getRecord throughput with 1 and 8 concurrent clients, uploadBlob and getBlob throughput of
// 64 KiB blobs, and write-to-firehose latency.
// Run: SOCIALWEB_BENCH=1 go test ./internal/pds/bench -run TestBenchCompare -v
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/pds/refpds"
)

const phase = 3 * time.Second

type target struct {
	name  string
	url   string
	email bool
}

func clients(ctx context.Context, t *testing.T, tg target, n int, tag string) []*atclient.Client {
	out := make([]*atclient.Client, n)
	for i := range out {
		c := atclient.New(tg.url)
		email := ""
		if tg.email {
			email = fmt.Sprintf("b%s%d@example.test", tag, i)
		}
		if _, err := c.CreateAccount(ctx, fmt.Sprintf("b%s%d.test", tag, i), "bench-pw", email); err != nil {
			t.Fatalf("%s: account: %v", tg.name, err)
		}
		out[i] = c
	}
	return out
}

// throughput runs op from every client until the phase ends and returns operations/second.
func throughput(cs []*atclient.Client, op func(c *atclient.Client, i int) error) (float64, error) {
	var n atomic.Int64
	var firstErr atomic.Value
	deadline := time.Now().Add(phase)
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range cs {
		wg.Add(1)
		go func(c *atclient.Client) {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				if err := op(c, i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				n.Add(1)
			}
		}(c)
	}
	wg.Wait()
	if e, _ := firstErr.Load().(error); e != nil {
		return 0, e
	}
	return float64(n.Load()) / time.Since(start).Seconds(), nil
}

type result struct{ put1, put8, get1, get8 float64 }

func measure(ctx context.Context, t *testing.T, tg target) result {
	var r result
	var err error
	for _, n := range []int{1, 8} {
		cs := clients(ctx, t, tg, n, fmt.Sprintf("c%d", n))
		put, err2 := throughput(cs, func(c *atclient.Client, i int) error {
			_, err := c.PutRecord(ctx, "app.socialweb.bench", fmt.Sprintf("r%d", i), map[string]any{"i": i, "text": "benchmark record"}, nil)
			return err
		})
		if err2 != nil {
			t.Fatalf("%s put x%d: %v", tg.name, n, err2)
		}
		get, err2 := throughput(cs, func(c *atclient.Client, i int) error {
			_, err := c.GetRecord(ctx, "", "app.socialweb.bench", "r0")
			return err
		})
		if err2 != nil {
			t.Fatalf("%s get x%d: %v", tg.name, n, err2)
		}
		if n == 1 {
			r.put1, r.get1 = put, get
		} else {
			r.put8, r.get8 = put, get
		}
	}
	_ = err
	return r
}

const blobSize = 64 << 10

// blobCall posts (body non-nil: uploadBlob) or gets (getBlob of cid) one blob over HTTP.
func blobCall(ctx context.Context, c *atclient.Client, url string, body []byte, cid string) ([]byte, error) {
	var req *http.Request
	if body != nil {
		req, _ = http.NewRequestWithContext(ctx, "POST", url+"/xrpc/com.atproto.repo.uploadBlob", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set("Authorization", "Bearer "+c.Session().AccessJwt)
	} else {
		req, _ = http.NewRequestWithContext(ctx, "GET", url+"/xrpc/com.atproto.sync.getBlob?did="+c.DID()+"&cid="+cid, nil)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	return b, err
}

// blobThroughput measures uploadBlob (each upload a different blob) and getBlob (of one blob
// a record references) with 1 client, in operations/second.
func blobThroughput(ctx context.Context, t *testing.T, tg target) (up, get float64) {
	c := clients(ctx, t, tg, 1, "blob")[0]
	data := make([]byte, blobSize)
	for i := range data {
		data[i] = byte(i * 7)
	}
	raw, err := blobCall(ctx, c, tg.url, data, "")
	if err != nil {
		t.Fatalf("%s: uploadBlob: %v", tg.name, err)
	}
	var out struct {
		Blob map[string]any `json:"blob"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutRecord(ctx, "app.socialweb.bench", "blob", map[string]any{"b": out.Blob}, nil); err != nil {
		t.Fatalf("%s: record naming the blob: %v", tg.name, err)
	}
	cid := out.Blob["ref"].(map[string]any)["$link"].(string)
	up, err = throughput([]*atclient.Client{c}, func(c *atclient.Client, i int) error {
		data[0], data[1], data[2], data[3] = byte(i), byte(i>>8), byte(i>>16), byte(i>>24)+1
		_, err := blobCall(ctx, c, tg.url, data, "")
		return err
	})
	if err != nil {
		t.Fatalf("%s: uploadBlob: %v", tg.name, err)
	}
	get, err = throughput([]*atclient.Client{c}, func(c *atclient.Client, i int) error {
		b, err := blobCall(ctx, c, tg.url, nil, cid)
		if err == nil && len(b) != blobSize {
			err = fmt.Errorf("getBlob: %d bytes", len(b))
		}
		return err
	})
	if err != nil {
		t.Fatalf("%s: getBlob: %v", tg.name, err)
	}
	return up, get
}

// firehoseLatency measures from just before putRecord is sent to the #commit arriving at a
// subscribed consumer.
func firehoseLatency(ctx context.Context, t *testing.T, tg target, writes int) (p50, p99 time.Duration) {
	c := clients(ctx, t, tg, 1, "fh")[0]
	arrived := make(chan string, writes)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan struct{})
	var once sync.Once
	cons := &atclient.Consumer{Host: tg.url, Handle: func(ev *firehose.Event) error {
		once.Do(func() { close(ready) })
		if ev.Commit != nil && ev.Commit.Repo == c.DID() && len(ev.Commit.Ops) > 0 {
			arrived <- ev.Commit.Ops[0].Path
		}
		return nil
	}}
	go cons.Run(cctx)
	// Prime: the first write tells us the subscription is live.
	for primed := false; !primed; {
		if _, err := c.PutRecord(ctx, "app.socialweb.fh", "prime", map[string]any{"t": time.Now().UnixMilli()}, nil); err != nil {
			t.Fatalf("%s: prime: %v", tg.name, err)
		}
		select {
		case <-ready:
			primed = true
			<-arrived
		case <-time.After(500 * time.Millisecond):
		}
	}
	lat := make([]time.Duration, 0, writes)
	for i := 0; i < writes; i++ {
		path := fmt.Sprintf("app.socialweb.fh/w%d", i)
		start := time.Now()
		if _, err := c.PutRecord(ctx, "app.socialweb.fh", fmt.Sprintf("w%d", i), map[string]any{"i": i}, nil); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case p := <-arrived:
				if p != path {
					continue
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: no firehose event for %s", tg.name, path)
			}
			break
		}
		lat = append(lat, time.Since(start))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[len(lat)/2], lat[len(lat)*99/100]
}

func TestBenchCompare(t *testing.T) {
	if os.Getenv("SOCIALWEB_BENCH") != "1" {
		t.Skip("set SOCIALWEB_BENCH=1 to run the PDS comparison")
	}
	ctx := context.Background()
	s, err := pds.New(pds.Config{DataDir: t.TempDir(), OpenSignup: true, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	peer, err := refpds.Start(ctx)
	if err != nil {
		t.Fatalf("reference PDS: %v", err)
	}
	defer peer.Stop()

	ourT := target{name: "ours", url: s.URL()}
	refT := target{name: "reference", url: peer.PDSURL, email: true}
	o := measure(ctx, t, ourT)
	r := measure(ctx, t, refT)
	oUp, oGet := blobThroughput(ctx, t, ourT)
	rUp, rGet := blobThroughput(ctx, t, refT)
	op50, op99 := firehoseLatency(ctx, t, ourT, 200)
	rp50, rp99 := firehoseLatency(ctx, t, refT, 200)

	row := func(name string, ours, ref float64) {
		t.Logf("%-26s ours %8.0f/s   reference %8.0f/s   ratio %5.2fx", name, ours, ref, ours/ref)
	}
	t.Logf("PDS comparison (%s per phase, loopback, same machine)", phase)
	row("putRecord, 1 client", o.put1, r.put1)
	row("putRecord, 8 clients", o.put8, r.put8)
	row("getRecord, 1 client", o.get1, r.get1)
	row("getRecord, 8 clients", o.get8, r.get8)
	row("uploadBlob 64K, 1 client", oUp, rUp)
	row("getBlob 64K, 1 client", oGet, rGet)
	t.Logf("write-to-firehose          ours p50 %v p99 %v   reference p50 %v p99 %v", op50.Round(10*time.Microsecond), op99.Round(10*time.Microsecond), rp50.Round(10*time.Microsecond), rp99.Round(10*time.Microsecond))
}
