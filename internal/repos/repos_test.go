package repos

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"socialweb.computer/internal/pds"
)

func TestBackoff(t *testing.T) {
	rows := []struct {
		n    int
		want time.Duration
	}{
		{0, 0}, {-1, 0}, {1, 2 * time.Second}, {2, 4 * time.Second}, {3, 8 * time.Second},
		{8, 256 * time.Second}, {9, 5 * time.Minute}, {100, 5 * time.Minute},
	}
	for _, r := range rows {
		if got := Backoff(r.n, 2*time.Second, 5*time.Minute); got != r.want {
			t.Errorf("Backoff(%d) = %s, want %s", r.n, got, r.want)
		}
	}
}

func TestLocalRepo(t *testing.T) {
	ctx := context.Background()
	srv, err := pds.New(pds.Config{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	did, err := srv.CreateAccount(ctx, "owner.test", "password-1234")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Local(ctx, nil, "owner.test"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no PDS: %v, want ErrUnavailable", err)
	}
	if _, err := Local(ctx, srv, "nobody-here.test"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("unknown account: %v, want ErrUnavailable", err)
	}
	r, err := Local(ctx, srv, "owner.test")
	if err != nil || r.DID() != did || r.Handle() != "owner.test" || r.Endpoint() != srv.URL() {
		t.Fatalf("Local: %v %+v", err, r)
	}

	events := make(chan Event, 16)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = r.Events().Subscribe(sctx, nil, func(ev Event) error { events <- ev; return nil })
	}()
	time.Sleep(50 * time.Millisecond) // let the live subscription attach

	const coll = "com.example.note"
	if _, err := r.Get(ctx, coll, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get missing: %v, want ErrNotFound", err)
	}
	none := ""
	w1, err := r.Put(ctx, coll, "a", json.RawMessage(`{"text":"one","n":9007199254740991}`), &none)
	if err != nil || !w1.Changed {
		t.Fatalf("Put: %v %+v", err, w1)
	}
	if _, err := r.Put(ctx, coll, "a", json.RawMessage(`{"text":"two"}`), &none); !errors.Is(err, ErrSwapMismatch) {
		t.Fatalf("Put must-not-exist over a record: %v, want ErrSwapMismatch", err)
	}
	stale := "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"
	if _, err := r.Put(ctx, coll, "a", json.RawMessage(`{"text":"two"}`), &stale); !errors.Is(err, ErrSwapMismatch) {
		t.Fatalf("Put with a stale swap: %v, want ErrSwapMismatch", err)
	}
	w2, err := r.Put(ctx, coll, "a", json.RawMessage(`{"text":"two"}`), &w1.CID)
	if err != nil || w2.CID == w1.CID {
		t.Fatalf("Put with the right swap: %v %+v", err, w2)
	}
	if _, err := r.Put(ctx, coll, "b", json.RawMessage(`{"$type":"com.example.other"}`), nil); !errors.Is(err, ErrInvalidRecord) {
		t.Fatalf("Put with a wrong $type: %v, want ErrInvalidRecord", err)
	}
	got, err := r.Get(ctx, coll, "a")
	if err != nil || got.CID != w2.CID {
		t.Fatalf("Get: %v %+v", err, got)
	}
	list, _, err := r.List(ctx, coll, "", 10)
	if err != nil || len(list) != 1 || list[0].CID != w2.CID {
		t.Fatalf("List: %v %+v", err, list)
	}
	if err := r.Delete(ctx, coll, "a", nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(ctx, coll, "a", nil); err != nil {
		t.Fatalf("deleting a missing record: %v", err)
	}
	var actions []string
	for len(actions) < 3 {
		select {
		case ev := <-events:
			for _, op := range ev.Ops {
				if ev.DID == did && op.Collection == coll {
					actions = append(actions, op.Action+":"+op.CID)
				}
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("events: %v", actions)
		}
	}
	want := []string{"create:" + w1.CID, "update:" + w2.CID, "delete:"}
	for i := range want {
		if actions[i] != want[i] {
			t.Fatalf("events %v, want %v", actions, want)
		}
	}
}
