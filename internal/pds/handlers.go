package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"
	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/pds/plc"
	"socialweb.computer/internal/xrpc"
)

// MaxBodyBytes is the largest XRPC request body accepted.
const MaxBodyBytes = 1 << 20

type xrpcHandler struct {
	procedure bool
	fn        func(ctx context.Context, r *http.Request) (any, error)
}

func (s *Server) routes() http.Handler {
	methods := map[string]xrpcHandler{
		"com.atproto.server.describeServer":        {false, s.hDescribeServer},
		"com.atproto.server.createAccount":         {true, s.hCreateAccount},
		"com.atproto.server.createSession":         {true, s.hCreateSession},
		"com.atproto.server.refreshSession":        {true, s.hRefreshSession},
		"com.atproto.server.getSession":            {false, s.hGetSession},
		"com.atproto.server.deleteSession":         {true, s.hDeleteSession},
		"com.atproto.server.getServiceAuth":        {false, s.hGetServiceAuth},
		"com.atproto.server.createInviteCode":      {true, s.hCreateInviteCode},
		"com.atproto.server.createInviteCodes":     {true, s.hCreateInviteCodes},
		"com.atproto.server.getAccountInviteCodes": {false, s.hGetAccountInviteCodes},
		"com.atproto.identity.resolveHandle":       {false, s.hResolveHandle},
		"com.atproto.repo.createRecord":            {true, s.hCreateRecord},
		"com.atproto.repo.putRecord":               {true, s.hPutRecord},
		"com.atproto.repo.deleteRecord":            {true, s.hDeleteRecord},
		"com.atproto.repo.applyWrites":             {true, s.hApplyWrites},
		"com.atproto.repo.getRecord":               {false, s.hGetRecord},
		"com.atproto.repo.listRecords":             {false, s.hListRecords},
		"com.atproto.repo.describeRepo":            {false, s.hDescribeRepo},
		"com.atproto.sync.getLatestCommit":         {false, s.hGetLatestCommit},
		"com.atproto.sync.listRepos":               {false, s.hListRepos},
		"com.atproto.sync.getRepoStatus":           {false, s.hGetRepoStatus},
		"com.atproto.sync.getRepo":                 {false, nil},
		"com.atproto.sync.getRecord":               {false, nil},
		"com.atproto.sync.subscribeRepos":          {false, nil},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/xrpc/_health", func(w http.ResponseWriter, r *http.Request) {
		xrpc.WriteJSON(w, 200, map[string]string{"version": "socialweb-pds"})
	})
	mux.HandleFunc("/.well-known/atproto-did", s.hWellKnownDID)
	mux.HandleFunc("/xrpc/com.atproto.sync.getRepo", s.hGetRepoCAR)
	mux.HandleFunc("/xrpc/com.atproto.sync.getRecord", s.hSyncGetRecord)
	mux.HandleFunc("/xrpc/com.atproto.sync.subscribeRepos", s.hSubscribeRepos)
	mux.HandleFunc("/xrpc/", func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				s.log.Error("xrpc handler panic", "method", r.URL.Path, "panic", p)
				xrpc.WriteError(w, nil)
			}
		}()
		name := strings.TrimPrefix(r.URL.Path, "/xrpc/")
		h, ok := methods[name]
		if !ok || h.fn == nil {
			xrpc.WriteJSON(w, 501, map[string]string{"error": "MethodNotImplemented", "message": "Method Not Implemented"})
			return
		}
		if h.procedure && r.Method != http.MethodPost {
			xrpc.WriteError(w, errInvalidRequest("Incorrect HTTP method (%s) expected POST", r.Method))
			return
		}
		if !h.procedure && r.Method != http.MethodGet && r.Method != http.MethodHead {
			xrpc.WriteError(w, errInvalidRequest("Incorrect HTTP method (%s) expected GET", r.Method))
			return
		}
		out, err := h.fn(context.WithValue(r.Context(), respHeaderKey{}, w.Header()), r)
		if err != nil {
			var xe *XRPCError
			if !errors.As(err, &xe) {
				s.log.Error("xrpc", "method", name, "err", err)
			}
			xrpc.WriteError(w, asXRPC(err))
			return
		}
		if out == nil {
			out = map[string]any{}
		}
		xrpc.WriteJSON(w, 200, out)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "This is an atproto PDS (socialweb.computer).\n")
	})
	return mux
}

// respHeaderKey carries the response's header map to handlers that set headers of their own
// (createSession's rate-limit headers).
type respHeaderKey struct{}

func respHeader(ctx context.Context) http.Header {
	if h, ok := ctx.Value(respHeaderKey{}).(http.Header); ok {
		return h
	}
	return http.Header{}
}

func asXRPC(err error) error {
	var xe *XRPCError
	if errors.As(err, &xe) {
		return xe
	}
	return err
}

// decodeInput reads a JSON procedure body into v with the reference PDS's refusals.
func decodeInput(r *http.Request, v any) error {
	ct := r.Header.Get("Content-Type")
	if mt, _, _ := strings.Cut(ct, ";"); strings.TrimSpace(strings.ToLower(mt)) != "application/json" {
		return errInvalidRequest("Wrong request encoding (Content-Type): %s", ct)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return errInvalidRequest("could not read request body")
	}
	return decodeJSONBody(body, v)
}

func decodeJSONBody(body []byte, v any) error {
	if len(body) > MaxBodyBytes {
		return errNamed(413, "PayloadTooLargeError", "request entity too large")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return errInvalidRequest("Invalid request body: %v", err)
	}
	return nil
}

func (s *Server) authAccess(r *http.Request) (string, error) {
	c, err := s.parseToken(r.Header.Get("Authorization"), scopeAccess)
	if err != nil {
		return "", err
	}
	return c.Subject, nil
}

// authRepo checks the caller's session and that repo names the caller's own account.
func (s *Server) authRepo(r *http.Request, repo string) (string, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return "", err
	}
	if repo == "" {
		return "", errInvalidRequest("Missing required key \"repo\" at $")
	}
	target := repo
	if !strings.HasPrefix(repo, "did:") {
		d, _ := s.resolveHandleLocal(repo)
		if d == "" {
			return "", errNamed(403, "AccountNotFound", "Account not found")
		}
		target = d
	}
	if target != did {
		var exists bool
		_ = s.db.View(func(tx *bolt.Tx) error {
			exists = tx.Bucket(bAccounts).Get([]byte(target)) != nil
			return nil
		})
		if !exists {
			return "", errNamed(403, "AccountNotFound", "Account not found")
		}
		return "", errNamed(401, "AuthenticationRequired", "Authentication Required")
	}
	return did, nil
}

// swapField decodes a swapRecord that may be absent (nil), null (must not exist) or a CID.
func swapField(raw json.RawMessage, nullable bool) (*Swap, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, nil
	}
	if string(raw) == "null" {
		if !nullable {
			return nil, errInvalidRequest("Expected string value type (got null) at $.swapRecord")
		}
		return &Swap{}, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, errInvalidRequest("Expected string value type at $.swapRecord")
	}
	if s == "" {
		return nil, errInvalidRequest("Invalid CID string (got \"\") at $.swapRecord")
	}
	return &Swap{CID: s}, nil
}

type recordOut struct {
	URI              string      `json:"uri"`
	CID              string      `json:"cid"`
	Commit           *CommitInfo `json:"commit,omitempty"`
	ValidationStatus string      `json:"validationStatus,omitempty"`
}

func statusFor(validate *bool, st string) string {
	if validate != nil && !*validate {
		return ""
	}
	return st
}

func (s *Server) checkValidateFlag(validate *bool, collection string) error {
	if validate == nil || !*validate {
		return nil
	}
	if s.cfg.Lexicons != nil {
		if _, err := s.cfg.Lexicons.Resolve(collection); err == nil {
			return nil
		}
	}
	return errInvalidRequest("Lexicon not found: lex:%s", collection)
}

// recordWriteInput is the input of createRecord and putRecord (createRecord has no
// swapRecord; a client that sends one anyway has it ignored, as the reference PDS does).
type recordWriteInput struct {
	Repo       string          `json:"repo"`
	Collection string          `json:"collection"`
	RKey       string          `json:"rkey"`
	Validate   *bool           `json:"validate"`
	Record     json.RawMessage `json:"record"`
	SwapRecord json.RawMessage `json:"swapRecord"`
	SwapCommit *string         `json:"swapCommit"`
}

func (s *Server) hPutRecord(ctx context.Context, r *http.Request) (any, error) {
	return s.writeOneRecord(ctx, r, ActionUpdate)
}

func (s *Server) hCreateRecord(ctx context.Context, r *http.Request) (any, error) {
	return s.writeOneRecord(ctx, r, ActionCreate)
}

// writeOneRecord is createRecord (ActionCreate) and putRecord (ActionUpdate): decode, the
// caller owns the repo, the validate flag, one write, and the written record's reference.
func (s *Server) writeOneRecord(ctx context.Context, r *http.Request, action Action) (any, error) {
	var in recordWriteInput
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	did, err := s.authRepo(r, in.Repo)
	if err != nil {
		return nil, err
	}
	w := Write{Action: action, Collection: in.Collection, RKey: in.RKey, Raw: in.Record}
	mode := modeBatch
	if action == ActionUpdate {
		// putRecord: swapRecord null means "must not exist", and the single-write mode.
		if w.SwapRecord, err = swapField(in.SwapRecord, true); err != nil {
			return nil, err
		}
		mode = modeSingle
	}
	if err := s.checkValidateFlag(in.Validate, in.Collection); err != nil {
		return nil, err
	}
	commit, res, err := s.applyWrites(ctx, did, []Write{w}, deref(in.SwapCommit), mode)
	if err != nil {
		return nil, err
	}
	return recordOut{URI: res[0].URI, CID: res[0].CID, Commit: commit, ValidationStatus: statusFor(in.Validate, res[0].ValidationStatus)}, nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func (s *Server) hDeleteRecord(ctx context.Context, r *http.Request) (any, error) {
	var in struct {
		Repo       string          `json:"repo"`
		Collection string          `json:"collection"`
		RKey       string          `json:"rkey"`
		SwapRecord json.RawMessage `json:"swapRecord"`
		SwapCommit *string         `json:"swapCommit"`
	}
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	did, err := s.authRepo(r, in.Repo)
	if err != nil {
		return nil, err
	}
	swap, err := swapField(in.SwapRecord, false)
	if err != nil {
		return nil, err
	}
	commit, _, err := s.applyWrites(ctx, did, []Write{{Action: ActionDelete, Collection: in.Collection, RKey: in.RKey,
		SwapRecord: swap}}, deref(in.SwapCommit), modeSingle)
	if err != nil {
		return nil, err
	}
	if commit == nil {
		return map[string]any{}, nil
	}
	return map[string]any{"commit": commit}, nil
}

func (s *Server) hApplyWrites(ctx context.Context, r *http.Request) (any, error) {
	var in struct {
		Repo     string `json:"repo"`
		Validate *bool  `json:"validate"`
		Writes   []struct {
			Type       string          `json:"$type"`
			Collection string          `json:"collection"`
			RKey       string          `json:"rkey"`
			Value      json.RawMessage `json:"value"`
		} `json:"writes"`
		SwapCommit *string `json:"swapCommit"`
	}
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	did, err := s.authRepo(r, in.Repo)
	if err != nil {
		return nil, err
	}
	writes := make([]Write, len(in.Writes))
	for i, w := range in.Writes {
		var a Action
		switch w.Type {
		case "com.atproto.repo.applyWrites#create":
			a = ActionCreate
		case "com.atproto.repo.applyWrites#update":
			a = ActionUpdate
		case "com.atproto.repo.applyWrites#delete":
			a = ActionDelete
		default:
			return nil, errInvalidRequest("Invalid $type at $.writes[%d]: %q", i, w.Type)
		}
		if a != ActionDelete {
			if err := s.checkValidateFlag(in.Validate, w.Collection); err != nil {
				return nil, err
			}
		}
		writes[i] = Write{Action: a, Collection: w.Collection, RKey: w.RKey, Raw: w.Value}
	}
	commit, res, err := s.applyWrites(ctx, did, writes, deref(in.SwapCommit), modeBatch)
	if err != nil {
		return nil, err
	}
	results := make([]map[string]any, len(res))
	for i, wr := range res {
		m := map[string]any{"$type": "com.atproto.repo.applyWrites#" + string(wr.Action) + "Result"}
		if wr.Action != ActionDelete {
			m["uri"] = wr.URI
			m["cid"] = wr.CID
			if st := statusFor(in.Validate, wr.ValidationStatus); st != "" {
				m["validationStatus"] = st
			}
		}
		results[i] = m
	}
	return map[string]any{"commit": commit, "results": results}, nil
}

// Reads.

func queryParams(r *http.Request, method string, required ...string) (map[string]string, error) {
	q := r.URL.Query()
	out := map[string]string{}
	for k := range q {
		out[k] = q.Get(k)
	}
	for _, k := range required {
		if out[k] == "" {
			return nil, errInvalidRequest("Invalid %s params: Missing required key %q", method, k)
		}
	}
	return out, nil
}

func (s *Server) hGetRecord(ctx context.Context, r *http.Request) (any, error) {
	const m = "com.atproto.repo.getRecord"
	p, err := queryParams(r, m, "repo", "collection", "rkey")
	if err != nil {
		return nil, err
	}
	if _, err := syntax.ParseNSID(p["collection"]); err != nil {
		return nil, errInvalidRequest("Invalid %s params: Invalid NSID (got %q)", m, p["collection"])
	}
	if _, err := syntax.ParseRecordKey(p["rkey"]); err != nil {
		return nil, errInvalidRequest("Invalid %s params: Invalid record key (got %q)", m, p["rkey"])
	}
	did, _, err := s.resolveRepo(p["repo"])
	if err != nil {
		return nil, errInvalidRequest("Could not locate record")
	}
	rec, err := s.GetRecord(ctx, did, p["collection"], p["rkey"])
	if err != nil {
		return nil, err
	}
	if want := p["cid"]; want != "" && want != rec.CID {
		return nil, errNamed(400, "RecordNotFound", "Could not locate record: %s", rec.URI)
	}
	return rec, nil
}

func (s *Server) hListRecords(ctx context.Context, r *http.Request) (any, error) {
	const m = "com.atproto.repo.listRecords"
	p, err := queryParams(r, m, "repo", "collection")
	if err != nil {
		return nil, err
	}
	if _, err := syntax.ParseNSID(p["collection"]); err != nil {
		return nil, errInvalidRequest("Invalid %s params: Invalid NSID (got %q)", m, p["collection"])
	}
	limit := 50
	if v, ok := p["limit"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, errInvalidRequest("Invalid %s params: Expected integer value type at $.limit", m)
		}
		if n < 1 {
			return nil, errInvalidRequest("Invalid %s params: integer too small (minimum 1, got %d)", m, n)
		}
		if n > 100 {
			return nil, errInvalidRequest("Invalid %s params: integer too big (maximum 100, got %d)", m, n)
		}
		limit = n
	}
	reverse := false
	if v, ok := p["reverse"]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, errInvalidRequest("Invalid %s params: Expected boolean value type at $.reverse", m)
		}
		reverse = b
	}
	did, _, err := s.resolveRepo(p["repo"])
	if err != nil {
		var xe *XRPCError
		if errors.As(err, &xe) && xe.Name == "RepoNotFound" {
			return nil, errInvalidRequest("Could not find repo: %s", p["repo"])
		}
		return nil, err
	}
	recs, cursor, err := s.ListRecords(ctx, did, p["collection"], limit, p["cursor"], reverse)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"records": recs}
	if cursor != "" {
		out["cursor"] = cursor
	}
	return out, nil
}

func (s *Server) hDescribeRepo(ctx context.Context, r *http.Request) (any, error) {
	p, err := queryParams(r, "com.atproto.repo.describeRepo", "repo")
	if err != nil {
		return nil, err
	}
	did, acct, err := s.resolveRepo(p["repo"])
	if err != nil {
		return nil, err
	}
	colls, err := s.collections(did)
	if err != nil {
		return nil, err
	}
	var doc any
	if s.plcLocal != nil {
		doc, _ = s.plcLocal.Document(ctx, did)
	}
	return map[string]any{"handle": acct.Handle, "did": did, "didDoc": doc, "collections": colls, "handleIsCorrect": true}, nil
}

func (s *Server) hGetLatestCommit(ctx context.Context, r *http.Request) (any, error) {
	p, err := queryParams(r, "com.atproto.sync.getLatestCommit", "did")
	if err != nil {
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
			rows = append(rows, repoRow{DID: string(k), Head: h.Commit, Rev: h.Rev, Active: true})
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

func (s *Server) hResolveHandle(ctx context.Context, r *http.Request) (any, error) {
	p, err := queryParams(r, "com.atproto.identity.resolveHandle", "handle")
	if err != nil {
		return nil, err
	}
	if _, err := syntax.ParseHandle(p["handle"]); err != nil {
		return nil, errInvalidRequest("Invalid com.atproto.identity.resolveHandle params: Invalid handle (got %q)", p["handle"])
	}
	did, _ := s.resolveHandleLocal(p["handle"])
	if did == "" {
		return nil, errNamed(400, "HandleNotFound", "Unable to resolve handle")
	}
	return map[string]string{"did": did}, nil
}

func (s *Server) hWellKnownDID(w http.ResponseWriter, r *http.Request) {
	did, _ := s.resolveHandleLocal(hostOnly(r.Host))
	if did == "" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(404)
		_, _ = io.WriteString(w, "User not found")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, did)
}

// Server and session endpoints.

func (s *Server) hDescribeServer(ctx context.Context, r *http.Request) (any, error) {
	return map[string]any{"did": s.cfg.ServiceDID, "availableUserDomains": s.cfg.UserDomains,
		"inviteCodeRequired": s.InvitesRequired(), "links": map[string]any{}, "contact": map[string]any{}}, nil
}

func (s *Server) sessionOut(acct *account, access, refresh string) map[string]any {
	out := map[string]any{"did": acct.DID, "handle": acct.Handle, "accessJwt": access, "refreshJwt": refresh, "active": true}
	if s.plcLocal != nil {
		if doc, err := s.plcLocal.Document(context.Background(), acct.DID); err == nil {
			out["didDoc"] = doc
		}
	}
	if acct.Email != "" {
		out["email"] = acct.Email
		out["emailConfirmed"] = false
	}
	return out
}

func (s *Server) hCreateAccount(ctx context.Context, r *http.Request) (any, error) {
	var in struct {
		Handle     *string `json:"handle"`
		Password   string  `json:"password"`
		Email      string  `json:"email"`
		InviteCode string  `json:"inviteCode"`
	}
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	if in.Handle == nil {
		return nil, errInvalidRequest("Missing required key \"handle\" at $")
	}
	// The reference refuses a missing code before it looks at the handle, and a spent one
	// after; spendInvite checks again inside the account's transaction.
	invite := ""
	if s.InvitesRequired() {
		if in.InviteCode == "" {
			return nil, errInvite("No invite code provided")
		}
		if _, err := s.checkHandle(*in.Handle); err != nil {
			return nil, err
		}
		if err := s.checkInvite(in.InviteCode); err != nil {
			return nil, err
		}
		invite = in.InviteCode
	}
	_, acct, err := s.createAccount(ctx, *in.Handle, in.Password, in.Email, invite)
	if err != nil {
		return nil, err
	}
	access, refresh, err := s.issueSession(acct.DID)
	if err != nil {
		return nil, err
	}
	out := s.sessionOut(acct, access, refresh)
	delete(out, "active")
	delete(out, "email")
	delete(out, "emailConfirmed")
	return out, nil
}

func (s *Server) hCreateSession(ctx context.Context, r *http.Request) (any, error) {
	var in struct {
		Identifier string `json:"identifier"`
		Password   string `json:"password"`
	}
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	// Every attempt counts, good or bad, before the password is looked at (as the
	// reference's rate limiter runs before its handler).
	now := time.Now()
	st := s.logins.take(s.loginKey(in.Identifier), clientIP(r), now)
	st.setHeaders(respHeader(ctx), now)
	if !st.allowed {
		s.log.Warn("createSession rate-limited", "identifier", in.Identifier, "ip", clientIP(r))
		return nil, errRateLimited()
	}
	acct, err := s.checkPassword(in.Identifier, in.Password)
	if err != nil {
		return nil, err
	}
	access, refresh, err := s.issueSession(acct.DID)
	if err != nil {
		return nil, err
	}
	return s.sessionOut(acct, access, refresh), nil
}

func (s *Server) accountOf(did string) (*account, error) {
	var acct *account
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		acct, err = getAccount(tx, did)
		return err
	})
	return acct, err
}

func (s *Server) hRefreshSession(ctx context.Context, r *http.Request) (any, error) {
	c, err := s.parseToken(r.Header.Get("Authorization"), scopeRefresh)
	if err != nil {
		return nil, err
	}
	found, err := s.revokeRefresh(c.ID)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, errNamed(400, "ExpiredToken", "Token has been revoked")
	}
	acct, err := s.accountOf(c.Subject)
	if err != nil {
		return nil, err
	}
	access, refresh, err := s.issueSession(acct.DID)
	if err != nil {
		return nil, err
	}
	return s.sessionOut(acct, access, refresh), nil
}

func (s *Server) hGetSession(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	acct, err := s.accountOf(did)
	if err != nil {
		return nil, err
	}
	out := s.sessionOut(acct, "", "")
	delete(out, "accessJwt")
	delete(out, "refreshJwt")
	return out, nil
}

func (s *Server) hDeleteSession(ctx context.Context, r *http.Request) (any, error) {
	c, err := s.parseToken(r.Header.Get("Authorization"), scopeRefresh)
	if err != nil {
		return nil, err
	}
	if _, err := s.revokeRefresh(c.ID); err != nil {
		return nil, err
	}
	return map[string]any{}, nil
}

func (s *Server) hGetServiceAuth(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	p, err := queryParams(r, "com.atproto.server.getServiceAuth", "aud")
	if err != nil {
		return nil, err
	}
	if _, err := syntax.ParseDID(strings.SplitN(p["aud"], "#", 2)[0]); err != nil {
		return nil, errInvalidRequest("Invalid com.atproto.server.getServiceAuth params: Invalid DID (got %q)", p["aud"])
	}
	ttl := 60 * time.Second
	if v := p["exp"]; v != "" {
		exp, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, errInvalidRequest("Invalid com.atproto.server.getServiceAuth params: Expected integer value type at $.exp")
		}
		d := time.Until(time.Unix(exp, 0))
		if d > time.Hour {
			return nil, errNamed(400, "BadExpiration", "cannot request a token with an expiration more than an hour in the future")
		}
		if d <= 0 {
			return nil, errNamed(400, "BadExpiration", "expiration is in past")
		}
		ttl = d
	}
	var lxm *syntax.NSID
	if v := p["lxm"]; v != "" {
		n, err := syntax.ParseNSID(v)
		if err != nil {
			return nil, errInvalidRequest("Invalid com.atproto.server.getServiceAuth params: Invalid NSID (got %q)", v)
		}
		lxm = &n
	}
	tok, err := s.signServiceAuth(did, p["aud"], ttl, lxm)
	if err != nil {
		return nil, err
	}
	return map[string]string{"token": tok}, nil
}

func (s *Server) signServiceAuth(did, aud string, ttl time.Duration, lxm *syntax.NSID) (string, error) {
	acct, err := s.accountOf(did)
	if err != nil {
		return "", err
	}
	key, err := atcrypto.ParsePrivateBytesK256(acct.SigningKey)
	if err != nil {
		return "", err
	}
	return auth.SignServiceAuth(syntax.DID(did), aud, ttl, lxm, key)
}

// ServiceAuth mints the service-auth token getServiceAuth would give the hosted account did,
// for an in-process caller: aud a DID (optionally with a #fragment), lxm an NSID or "", ttl
// up to an hour.
func (s *Server) ServiceAuth(_ context.Context, did, aud, lxm string, ttl time.Duration) (string, error) {
	if _, err := syntax.ParseDID(strings.SplitN(aud, "#", 2)[0]); err != nil {
		return "", errInvalidRequest("service auth: invalid aud DID %q", aud)
	}
	if ttl <= 0 || ttl > time.Hour {
		return "", errNamed(400, "BadExpiration", "service auth: ttl %s outside (0, 1h]", ttl)
	}
	var nsid *syntax.NSID
	if lxm != "" {
		n, err := syntax.ParseNSID(lxm)
		if err != nil {
			return "", errInvalidRequest("service auth: invalid lxm NSID %q", lxm)
		}
		nsid = &n
	}
	return s.signServiceAuth(did, aud, ttl, nsid)
}

func decodeAccount(v []byte) (*account, error) {
	var a account
	err := json.Unmarshal(v, &a)
	return &a, err
}

// emitIdentity appends an #identity event for did.
func (s *Server) emitIdentity(did, handle string) error {
	return s.storeTx(func(tx *bolt.Tx, nextSeq func() (int64, error)) ([]storedFrame, error) {
		seq, err := nextSeq()
		if err != nil {
			return nil, err
		}
		h := handle
		b, err := firehose.Encode(firehose.TypeIdentity, &comatproto.SyncSubscribeRepos_Identity{Did: did, Handle: &h, Seq: seq, Time: nowString()})
		if err != nil {
			return nil, err
		}
		return []storedFrame{{seq: seq, typ: firehose.TypeIdentity, data: b}}, nil
	})
}

var _ = plc.TypeOperation
