package pds

import (
	"context"
	"io"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"

	"socialweb.computer/internal/xrpc"
)

// hUploadBlob is com.atproto.repo.uploadBlob, with the reference's refusals in its order:
// auth, a body at all, a Content-Type, the size limit (from Content-Length before reading,
// then while streaming), the Content-Encoding.
func (s *Server) hUploadBlob(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	if len(r.TransferEncoding) == 0 && r.Header.Get("Content-Length") == "" {
		return nil, errInvalidRequest("A request body is expected but none was provided")
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt == "" {
		return nil, errInvalidRequest("Request encoding (Content-Type) required but not provided")
	}
	if r.ContentLength > s.cfg.BlobUploadLimit {
		return nil, errPayloadTooLarge()
	}
	body, err := decodeContentEncoding(r.Header.Get("Content-Encoding"), r.Body)
	if err != nil {
		return nil, err
	}
	blob, err := s.UploadBlob(ctx, did, body, mt)
	if err != nil {
		return nil, err
	}
	return map[string]any{"blob": blob}, nil
}

// blobParams reads did (and cid when wantCID) the way the reference words its refusals, and
// checks that the repo is hosted here.
func (s *Server) blobParams(r *http.Request, method string, wantCID bool) (string, cid.Cid, error) {
	required := []string{"did"}
	if wantCID {
		required = append(required, "cid")
	}
	p, err := queryParams(r, method, required...)
	if err != nil {
		return "", cid.Undef, err
	}
	if _, err := syntax.ParseDID(p["did"]); err != nil {
		return "", cid.Undef, errInvalidRequest("Invalid %s params: Invalid DID (got %q)", method, p["did"])
	}
	var c cid.Cid
	if wantCID {
		if c, err = cid.Parse(p["cid"]); err != nil {
			return "", cid.Undef, errInvalidRequest("Invalid %s params: Invalid CID string (got %q)", method, p["cid"])
		}
	}
	_, acct, err := s.resolveRepo(p["did"])
	if err != nil {
		return "", cid.Undef, err
	}
	if err := s.repoServed(r, p["did"], acct); err != nil {
		return "", cid.Undef, err
	}
	return p["did"], c, nil
}

// hGetBlob is com.atproto.sync.getBlob: the bytes with their stored type, and the headers
// the reference sends so that a browser neither sniffs nor runs a blob (it may be HTML).
func (s *Server) hGetBlob(w http.ResponseWriter, r *http.Request) {
	const m = "com.atproto.sync.getBlob"
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		xrpc.WriteError(w, errInvalidRequest("Incorrect HTTP method (%s) expected GET", r.Method))
		return
	}
	did, c, err := s.blobParams(r, m, true)
	if err != nil {
		xrpc.WriteError(w, asXRPC(err))
		return
	}
	rc, info, err := s.openBlob(r.Context(), did, c)
	if err != nil {
		xrpc.WriteError(w, asXRPC(err))
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Length", strconv.FormatInt(info.Size, 10))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Disposition", `attachment; filename="`+c.String()+`"`)
	h.Set("Content-Security-Policy", "default-src 'none'; sandbox")
	h.Set("Content-Type", blobContentType(info.MimeType))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := io.Copy(w, rc); err != nil {
		s.log.Debug("getBlob: copy", "did", did, "cid", c, "err", err)
	}
}

var charsetParam = regexp.MustCompile(`;\s*charset\s*=`)

// blobContentType is the Content-Type getBlob sends for a stored type: the reference's web
// framework (Express 4) adds "; charset=utf-8" to text and JSON/JavaScript types that name
// no charset, and clients see that, so we do too.
func blobContentType(mimeType string) string {
	if mimeType == "" {
		return "application/octet-stream"
	}
	base, _, _ := strings.Cut(mimeType, ";")
	if !charsetParam.MatchString(mimeType) && (strings.HasPrefix(base, "text/") ||
		strings.HasPrefix(base, "application/javascript") || strings.HasPrefix(base, "application/json")) {
		return mimeType + "; charset=utf-8"
	}
	return mimeType
}

// listLimit reads limit (1..1000, default 500) as the reference's lexicons bound it.
func listLimit(q url.Values, method string) (int, error) {
	if !q.Has("limit") {
		return 500, nil
	}
	n, err := strconv.Atoi(q.Get("limit"))
	if err != nil {
		return 0, errInvalidRequest("Invalid %s params: Expected integer value type at $.limit", method)
	}
	if n < 1 {
		return 0, errInvalidRequest("Invalid %s params: integer too small (minimum 1, got %d)", method, n)
	}
	if n > 1000 {
		return 0, errInvalidRequest("Invalid %s params: integer too big (maximum 1000, got %d)", method, n)
	}
	return n, nil
}

// hListBlobs is com.atproto.sync.listBlobs: the CIDs of the blobs the repo's records
// reference, in CID order; since is a rev.
func (s *Server) hListBlobs(_ context.Context, r *http.Request) (any, error) {
	const m = "com.atproto.sync.listBlobs"
	did, _, err := s.blobParams(r, m, false)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	since := q.Get("since")
	if since != "" {
		if _, err := syntax.ParseTID(since); err != nil {
			return nil, errInvalidRequest("Invalid %s params: Invalid TID string (got %q)", m, since)
		}
	}
	limit, err := listLimit(q, m)
	if err != nil {
		return nil, err
	}
	cids, err := s.listBlobs(did, since, q.Get("cursor"), limit)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"cids": cids}
	if len(cids) > 0 {
		out["cursor"] = cids[len(cids)-1]
	}
	return out, nil
}

// hListMissingBlobs is com.atproto.repo.listMissingBlobs for the caller's own repo.
func (s *Server) hListMissingBlobs(_ context.Context, r *http.Request) (any, error) {
	const m = "com.atproto.repo.listMissingBlobs"
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	limit, err := listLimit(q, m)
	if err != nil {
		return nil, err
	}
	blobs, err := s.listMissingBlobs(did, q.Get("cursor"), limit)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"blobs": blobs}
	if len(blobs) > 0 {
		out["cursor"] = blobs[len(blobs)-1].CID
	}
	return out, nil
}
