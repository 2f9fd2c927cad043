package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/repos"
)

func TestDecodeCursors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		raw     string
		want    map[string]int64
		wantErr bool
	}{
		{name: "empty", raw: `{}`, want: map[string]int64{}},
		{name: "keys lose a trailing slash", raw: `{"cursors":{"http://relay.test/":12,"http://pds.test":3}}`,
			want: map[string]int64{"http://relay.test": 12, "http://pds.test": 3}},
		{name: "negative seq", raw: `{"cursors":{"http://relay.test":-1}}`, wantErr: true},
		{name: "not json", raw: `cursors`, wantErr: true},
		{name: "wrong type", raw: `{"cursors":{"http://relay.test":"12"}}`, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeCursors([]byte(tc.raw))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if d := cmp.Diff(tc.want, got); !tc.wantErr && d != "" {
				t.Fatalf("-want +got:\n%s", d)
			}
		})
	}
}

func TestCursorsRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "cursors.json")
	c, err := OpenCursors(path)
	if err != nil {
		t.Fatalf("missing file: %v", err)
	}
	if got := c.Get("http://relay.test"); got != 0 {
		t.Fatalf("no cursor yet: %d", got)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("nothing moved, yet the file was written: %v", err)
	}
	c.Set("http://relay.test/", 40)
	c.Set("http://pds.test", 5)
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	again, err := OpenCursors(path)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := again.Get("http://relay.test"), again.Get("http://pds.test/"); a != 40 || b != 5 {
		t.Fatalf("read back %d and %d, want 40 and 5", a, b)
	}
	// A source not followed in this run is dropped at the next write; a lower seq (a relay
	// started afresh) is kept.
	again.Set("http://relay.test", 2)
	if err := again.Flush(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f cursorFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string]int64{"http://relay.test": 2, "http://pds.test": 5}, f.Cursors); d != "" {
		t.Fatalf("-want +got:\n%s", d)
	}
	third, _ := OpenCursors(path)
	third.Set("http://relay.test", 3)
	if err := third.Flush(); err != nil {
		t.Fatal(err)
	}
	raw, _ = os.ReadFile(path)
	f = cursorFile{}
	_ = json.Unmarshal(raw, &f)
	if d := cmp.Diff(map[string]int64{"http://relay.test": 3}, f.Cursors); d != "" {
		t.Fatalf("unfollowed source kept: -want +got:\n%s", d)
	}
}

func TestOpenCursorsRefusesACorruptFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cursors.json")
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := OpenCursors(path)
	var ce *CursorFileError
	if !errors.As(err, &ce) || ce.Path != path {
		t.Fatalf("err %v, want a CursorFileError naming %s", err, path)
	}
}

func TestNilCursorsKeepNothing(t *testing.T) {
	var c *Cursors
	c.Set("http://relay.test", 4)
	if c.Get("http://relay.test") != 0 || c.Flush() != nil {
		t.Fatal("nil cursors")
	}
}

func TestFutureCursor(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{pds.ErrFutureCursor, true},
		{fmt.Errorf("%w: firehose error frame FutureCursor", atclient.ErrFatal), true},
		{pds.ErrConsumerTooSlow, false},
		{errors.New("connection reset"), false},
	} {
		if got := FutureCursor(tc.err); got != tc.want {
			t.Errorf("FutureCursor(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// futureSource refuses every cursor past its one event, as a relay started afresh does.
type futureSource struct{ asked chan int64 }

func (s futureSource) Subscribe(ctx context.Context, cursor *int64, fn func(repos.Event) error) error {
	s.asked <- *cursor
	if *cursor > 1 {
		return pds.ErrFutureCursor
	}
	if *cursor < 1 {
		if err := fn(repos.Event{Seq: 1}); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

func TestFollowDropsAFutureCursor(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := futureSource{asked: make(chan int64, 4)}
	got := make(chan int64, 1)
	go Follow(ctx, src, 9, func(ev repos.Event) { got <- ev.Seq })
	select {
	case seq := <-got:
		if seq != 1 {
			t.Fatalf("seq %d, want 1", seq)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event after the cursor was refused")
	}
	if a, b := <-src.asked, <-src.asked; a != 9 || b != 0 {
		t.Fatalf("asked from %d then %d, want 9 then 0", a, b)
	}
}
