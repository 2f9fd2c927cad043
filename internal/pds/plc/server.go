package plc

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"socialweb.computer/internal/xrpc"
)

// Handler serves the directory over plc.directory's HTTP API.
func (d *Directory) Handler() http.Handler {
	return http.HandlerFunc(d.serveHTTP)
}

func writeMsg(w http.ResponseWriter, status int, msg string) {
	xrpc.WriteJSON(w, status, map[string]string{"message": msg})
}

func (d *Directory) serveHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.Trim(r.URL.Path, "/")
	if path == "_health" {
		xrpc.WriteJSON(w, 200, map[string]string{"version": "socialweb-plc"})
		return
	}
	if path == "export" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		d.serveExport(w, r)
		return
	}
	did, sub, _ := strings.Cut(path, "/")
	if did == "" || !strings.HasPrefix(did, "did:plc:") {
		writeMsg(w, 404, "not found")
		return
	}
	ctx := r.Context()
	if r.Method == http.MethodPost {
		if sub != "" {
			writeMsg(w, 404, "not found")
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err != nil {
			writeMsg(w, 400, "could not read body")
			return
		}
		op, err := ParseOp(body)
		if err == nil {
			err = d.Submit(ctx, did, op)
		}
		if err != nil {
			var pe *Error
			if errors.As(err, &pe) {
				writeMsg(w, pe.Status, pe.Message)
				return
			}
			writeMsg(w, 500, "internal error")
			return
		}
		w.WriteHeader(200)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeMsg(w, 405, "method not allowed")
		return
	}
	var (
		v   any
		err error
	)
	switch sub {
	case "":
		v, err = d.Document(ctx, did)
	case "data":
		v, err = d.Data(ctx, did)
	case "log":
		v, err = d.Log(ctx, did)
	case "log/last":
		v, err = d.Last(ctx, did)
	case "log/audit":
		v, err = d.AuditLog(ctx, did)
	default:
		writeMsg(w, 404, "not found")
		return
	}
	switch {
	case errors.Is(err, ErrNotFound):
		writeMsg(w, 404, "DID not registered: "+did)
	case errors.Is(err, ErrTombstoned):
		writeMsg(w, 410, "DID not available: "+did)
	case err != nil:
		writeMsg(w, 500, "internal error")
	default:
		xrpc.WriteJSON(w, 200, v)
	}
}

// serveExport is plc.directory's GET /export: up to count (default and most 1000) operations of
// every DID created after the createdAt timestamp after (exclusive), oldest first, one JSON
// object a line, lines separated by a newline with none after the last. A client pages by
// passing the last line's createdAt as the next after; an empty body is the end.
func (d *Directory) serveExport(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	count := MaxExportCount
	if s := q.Get("count"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			writeMsg(w, 400, "Invalid count parameter")
			return
		}
		count = min(n, MaxExportCount)
	}
	var after time.Time
	if s := q.Get("after"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			writeMsg(w, 400, "Invalid after parameter: want an RFC 3339 timestamp such as a createdAt")
			return
		}
		after = t
	}
	entries, err := d.Export(r.Context(), after, count)
	if err != nil {
		writeMsg(w, 500, "internal error")
		return
	}
	var buf bytes.Buffer
	for i, e := range entries {
		if i > 0 {
			buf.WriteByte('\n')
		}
		b, err := json.Marshal(e)
		if err != nil {
			writeMsg(w, 500, "internal error")
			return
		}
		buf.Write(b)
	}
	w.Header().Set("Content-Type", "application/jsonlines")
	w.WriteHeader(200)
	_, _ = w.Write(buf.Bytes())
}
