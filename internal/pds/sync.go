package pds

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/gorilla/websocket"
	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/xrpc"
)

func writeCARResponse(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/vnd.ipld.car")
	w.WriteHeader(200)
	_, _ = w.Write(b)
}

func (s *Server) hGetRepoCAR(w http.ResponseWriter, r *http.Request) {
	did := r.URL.Query().Get("did")
	if did == "" {
		xrpc.WriteError(w, errInvalidRequest("Invalid com.atproto.sync.getRepo params: Missing required key \"did\""))
		return
	}
	if err := s.repoServedByDID(r, did); err != nil {
		xrpc.WriteError(w, asXRPC(err))
		return
	}
	b, err := s.repoCAR(did)
	if err != nil {
		xrpc.WriteError(w, asXRPC(err))
		return
	}
	writeCARResponse(w, b)
}

func (s *Server) hSyncGetRecord(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	did, coll, rkey := q.Get("did"), q.Get("collection"), q.Get("rkey")
	if did == "" || coll == "" || rkey == "" {
		xrpc.WriteError(w, errInvalidRequest("Invalid com.atproto.sync.getRecord params: did, collection and rkey are required"))
		return
	}
	if _, err := parseCollection(coll); err != nil {
		xrpc.WriteError(w, err)
		return
	}
	if _, err := parseRKey(rkey); err != nil {
		xrpc.WriteError(w, err)
		return
	}
	if err := s.repoServedByDID(r, did); err != nil {
		xrpc.WriteError(w, asXRPC(err))
		return
	}
	b, err := s.recordProofCAR(did, coll+"/"+rkey)
	if err != nil {
		xrpc.WriteError(w, asXRPC(err))
		return
	}
	writeCARResponse(w, b)
}

var upgrader = websocket.Upgrader{ReadBufferSize: 1024, WriteBufferSize: 64 << 10,
	CheckOrigin: func(*http.Request) bool { return true }}

func (s *Server) hSubscribeRepos(w http.ResponseWriter, r *http.Request) {
	var cursor *int64
	if v := r.URL.Query().Get("cursor"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			xrpc.WriteError(w, errInvalidRequest("Invalid com.atproto.sync.subscribeRepos params: Expected integer value type at $.cursor"))
			return
		}
		cursor = &n
	}
	conn, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer conn.Close()
	ctx := r.Context()
	// Reading keeps control frames flowing and notices the consumer hanging up.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, _, err := conn.NextReader(); err != nil {
				return
			}
		}
	}()
	ctx, cancel := contextWithDone(ctx, done)
	defer cancel()
	err = s.SubscribeFrames(ctx, cursor, func(f Frame) error {
		_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		return conn.WriteMessage(websocket.BinaryMessage, f.Data)
	})
	var frame []byte
	switch {
	case errors.Is(err, ErrFutureCursor):
		frame = firehose.EncodeError("FutureCursor", "Cursor in the future.")
	case errors.Is(err, ErrConsumerTooSlow):
		frame = firehose.EncodeError("ConsumerTooSlow", "Stream consumer too slow")
	}
	if frame != nil {
		_ = conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_ = conn.WriteMessage(websocket.BinaryMessage, frame)
	}
	_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
}

func contextWithDone(parent context.Context, done <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func (s *Server) hGetLatestCommit(ctx context.Context, r *http.Request) (any, error) {
	p, err := queryParams(r, "com.atproto.sync.getLatestCommit", "did")
	if err != nil {
		return nil, err
	}
	if err := s.repoServedByDID(r, p["did"]); err != nil {
		return nil, err
	}
	h, err := s.head(p["did"])
	if err != nil {
		return nil, err
	}
	return map[string]string{"cid": h.Commit, "rev": h.Rev}, nil
}

func (s *Server) hGetRepoStatus(ctx context.Context, r *http.Request) (any, error) {
	p, err := queryParams(r, "com.atproto.sync.getRepoStatus", "did")
	if err != nil {
		return nil, err
	}
	acct, err := s.accountOf(p["did"])
	if err != nil {
		return nil, err
	}
	if active, status := acct.status(); !active {
		return map[string]any{"did": p["did"], "active": false, "status": status}, nil
	}
	h, err := s.head(p["did"])
	if err != nil {
		return nil, err
	}
	return map[string]any{"did": p["did"], "active": true, "rev": h.Rev}, nil
}

func (s *Server) hListRepos(ctx context.Context, r *http.Request) (any, error) {
	p, _ := queryParams(r, "com.atproto.sync.listRepos")
	limit := 500
	if v := p["limit"]; v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return nil, errInvalidRequest("Invalid com.atproto.sync.listRepos params: limit must be 1..1000")
		}
		limit = n
	}
	type repoRow struct {
		DID    string `json:"did"`
		Head   string `json:"head"`
		Rev    string `json:"rev"`
		Active bool   `json:"active"`
		Status string `json:"status,omitempty"`
	}
	rows := []repoRow{}
	cursor := ""
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bRepos).Cursor()
		k, v := c.First()
		if cur := p["cursor"]; cur != "" {
			k, v = c.Seek([]byte(cur))
			if k != nil && string(k) == cur {
				k, v = c.Next()
			}
		}
		for ; k != nil; k, v = c.Next() {
			var h repoHead
			if err := json.Unmarshal(v, &h); err != nil {
				return err
			}
			row := repoRow{DID: string(k), Head: h.Commit, Rev: h.Rev, Active: true}
			if acct, err := getAccount(tx, string(k)); err == nil {
				row.Active, row.Status = acct.status()
			}
			rows = append(rows, row)
			if len(rows) == limit {
				cursor = string(k)
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := map[string]any{"repos": rows}
	if cursor != "" {
		out["cursor"] = cursor
	}
	return out, nil
}
