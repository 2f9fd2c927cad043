package pds

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"

	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/firehose"
)

// storedFrame is one firehose frame as persisted and broadcast.
type storedFrame struct {
	seq  int64
	typ  string
	data []byte
}

// subscriberBuffer is how many frames a live subscriber may fall behind before it is dropped.
const defaultSubscriberBuffer = 2048

type subscriber struct {
	ch   chan storedFrame
	slow chan struct{} // closed when the subscriber fell behind and was dropped
	once sync.Once
}

func (sub *subscriber) drop() { sub.once.Do(func() { close(sub.slow) }) }

// hub fans frames out to live subscribers without ever waiting on one.
type hub struct {
	buffer int // frames a subscriber may fall behind before it is dropped
	mu     sync.Mutex
	last   int64
	subs   map[*subscriber]struct{}
	closed chan struct{} // closed when the server closes
}

// storeTx runs fn in one bbolt write transaction; fn may allocate firehose seqs and returns the
// frames to store. After the transaction commits, the frames go to live subscribers in seq
// order. s.seqMu keeps commit order and broadcast order the same across repos.
func (s *Server) storeTx(fn func(tx *bolt.Tx, nextSeq func() (int64, error)) ([]storedFrame, error)) error {
	s.seqMu.Lock()
	defer s.seqMu.Unlock()
	var frames []storedFrame
	err := s.db.Update(func(tx *bolt.Tx) error {
		eb := tx.Bucket(bEvents)
		next := func() (int64, error) {
			n, err := eb.NextSequence()
			return int64(n), err
		}
		var err error
		frames, err = fn(tx, next)
		if err != nil {
			return err
		}
		for _, f := range frames {
			if err := eb.Put(seqKey(f.seq), f.data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.hub.publish(frames)
	return nil
}

func (h *hub) publish(frames []storedFrame) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, f := range frames {
		h.last = f.seq
		for sub := range h.subs {
			select {
			case sub.ch <- f:
			default:
				sub.drop()
				delete(h.subs, sub)
			}
		}
	}
}

func (h *hub) add() (*subscriber, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sub := &subscriber{ch: make(chan storedFrame, h.buffer), slow: make(chan struct{})}
	h.subs[sub] = struct{}{}
	return sub, h.last
}

func (h *hub) remove(sub *subscriber) {
	h.mu.Lock()
	delete(h.subs, sub)
	h.mu.Unlock()
}

// Errors a subscription ends with, named as the firehose error frames name them.
var (
	ErrFutureCursor    = errors.New("FutureCursor: Cursor in the future")
	ErrConsumerTooSlow = errors.New("ConsumerTooSlow: Stream consumer too slow")
	// ErrServerClosed ends the subscriptions of a server that is closing.
	ErrServerClosed = errors.New("pds: server closed")
)

// Frame is one raw firehose frame with its seq.
type Frame struct {
	Seq  int64
	Data []byte
}

// SubscribeFrames streams raw frames to fn in seq order: the stored ones after *cursor first
// (when cursor is not nil), then live ones, until ctx ends, fn returns an error, or the
// subscriber falls behind (ErrConsumerTooSlow).
func (s *Server) SubscribeFrames(ctx context.Context, cursor *int64, fn func(Frame) error) error {
	sub, last := s.hub.add()
	defer s.hub.remove(sub)
	sent := last
	if cursor != nil {
		if *cursor > last {
			return ErrFutureCursor
		}
		sent = *cursor
		// Replay from the store in pages, without holding a transaction across fn.
		for sent < last {
			select {
			case <-s.hub.closed:
				return ErrServerClosed
			default:
			}
			var page []Frame
			err := s.db.View(func(tx *bolt.Tx) error {
				c := tx.Bucket(bEvents).Cursor()
				for k, v := c.Seek(seqKey(sent + 1)); k != nil && len(page) < 256; k, v = c.Next() {
					seq := int64(binary.BigEndian.Uint64(k))
					if seq > last {
						break
					}
					page = append(page, Frame{Seq: seq, Data: append([]byte(nil), v...)})
				}
				return nil
			})
			if err != nil {
				return err
			}
			if len(page) == 0 {
				break
			}
			for _, f := range page {
				if err := fn(f); err != nil {
					return err
				}
				sent = f.Seq
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.hub.closed:
			return ErrServerClosed
		case <-sub.slow:
			// Deliver what is buffered is pointless: the consumer lost frames. End.
			return ErrConsumerTooSlow
		case f := <-sub.ch:
			if f.seq <= sent {
				continue
			}
			if err := fn(Frame{Seq: f.seq, Data: f.data}); err != nil {
				return err
			}
			sent = f.seq
		}
	}
}

// Subscribe is SubscribeFrames with decoded events, for in-process consumers.
func (s *Server) Subscribe(ctx context.Context, cursor *int64, fn func(*firehose.Event) error) error {
	return s.SubscribeFrames(ctx, cursor, func(f Frame) error {
		ev, err := firehose.Decode(f.Data)
		if err != nil {
			return err
		}
		return fn(ev)
	})
}

// LastSeq is the seq of the newest event committed (0: none yet). A subscriber from the
// start has replayed everything committed before it asked once it has handled this seq.
func (s *Server) LastSeq() int64 {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return s.hub.last
}

// lastSeq reads the newest stored seq.
func lastSeq(tx *bolt.Tx) int64 {
	k, _ := tx.Bucket(bEvents).Cursor().Last()
	if k == nil {
		return 0
	}
	return int64(binary.BigEndian.Uint64(k))
}
