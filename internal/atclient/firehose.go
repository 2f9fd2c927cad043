package atclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"socialweb.computer/internal/firehose"
)

// Consumer follows a PDS's com.atproto.sync.subscribeRepos. It remembers the last seq it
// handed to Handle and reconnects from there with exponential backoff when the stream breaks.
type Consumer struct {
	Host    string                                 // PDS base URL (http or https)
	Cursor  *int64                                 // start after this seq; nil starts live
	Handle  func(*firehose.Event) error            // called in seq order; an error stops Run
	OnError func(err error, retryIn time.Duration) // optional: told of each broken connection

	MinBackoff, MaxBackoff time.Duration // defaults 100 ms and 10 s
	Dialer                 *websocket.Dialer
}

// ErrFatal wraps stream errors that a reconnect cannot fix (FutureCursor).
var ErrFatal = errors.New("atclient: firehose refused the subscription")

// LastSeq is the seq of the last event handled, or -1.
func (c *Consumer) LastSeq() int64 {
	if c.Cursor == nil {
		return -1
	}
	return *c.Cursor
}

// Run consumes until ctx ends or Handle fails.
func (c *Consumer) Run(ctx context.Context) error {
	minB, maxB := c.MinBackoff, c.MaxBackoff
	if minB == 0 {
		minB = 100 * time.Millisecond
	}
	if maxB == 0 {
		maxB = 10 * time.Second
	}
	backoff := minB
	for {
		progressed, err := c.runOnce(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var he *handlerError
		if errors.As(err, &he) {
			return he.err
		}
		if errors.Is(err, ErrFatal) {
			return err
		}
		if progressed {
			backoff = minB
		}
		if c.OnError != nil {
			c.OnError(err, backoff)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff *= 2
		if backoff > maxB {
			backoff = maxB
		}
	}
}

type handlerError struct{ err error }

func (h *handlerError) Error() string { return h.err.Error() }

func (c *Consumer) runOnce(ctx context.Context) (bool, error) {
	u := strings.TrimRight(c.Host, "/")
	u = "ws" + strings.TrimPrefix(u, "http") + "/xrpc/com.atproto.sync.subscribeRepos"
	if c.Cursor != nil {
		u += "?cursor=" + strconv.FormatInt(*c.Cursor, 10)
	}
	d := c.Dialer
	if d == nil {
		d = websocket.DefaultDialer
	}
	conn, resp, err := d.DialContext(ctx, u, http.Header{})
	if err != nil {
		if resp != nil {
			return false, fmt.Errorf("dial %s: %w (HTTP %d)", u, err, resp.StatusCode)
		}
		return false, fmt.Errorf("dial %s: %w", u, err)
	}
	defer conn.Close()
	conn.SetReadLimit(firehose.MaxFrameSize)
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	progressed := false
	for {
		_, data, err := conn.ReadMessage()
		if err != nil {
			return progressed, err
		}
		ev, err := firehose.Decode(data)
		if err != nil {
			return progressed, err
		}
		if ev.Error != "" {
			err := fmt.Errorf("firehose error frame %s: %s", ev.Error, ev.ErrorMessage)
			if ev.Error == "FutureCursor" {
				return progressed, fmt.Errorf("%w: %v", ErrFatal, err)
			}
			return progressed, err
		}
		if ev.Seq == 0 && ev.Info != nil {
			continue
		}
		if c.Cursor != nil && ev.Seq <= *c.Cursor {
			continue
		}
		if err := c.Handle(ev); err != nil {
			return progressed, &handlerError{err}
		}
		seq := ev.Seq
		c.Cursor = &seq
		progressed = true
	}
}
