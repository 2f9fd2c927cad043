package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

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
		"com.atproto.server.describeServer":                 {false, s.hDescribeServer},
		"com.atproto.server.createAccount":                  {true, s.hCreateAccount},
		"com.atproto.server.createSession":                  {true, s.hCreateSession},
		"com.atproto.server.refreshSession":                 {true, s.hRefreshSession},
		"com.atproto.server.getSession":                     {false, s.hGetSession},
		"com.atproto.server.deleteSession":                  {true, s.hDeleteSession},
		"com.atproto.server.getServiceAuth":                 {false, s.hGetServiceAuth},
		"com.atproto.server.createInviteCode":               {true, s.hCreateInviteCode},
		"com.atproto.server.createInviteCodes":              {true, s.hCreateInviteCodes},
		"com.atproto.server.getAccountInviteCodes":          {false, s.hGetAccountInviteCodes},
		"com.atproto.server.checkAccountStatus":             {false, s.hCheckAccountStatus},
		"com.atproto.server.deactivateAccount":              {true, s.hDeactivateAccount},
		"com.atproto.server.activateAccount":                {true, s.hActivateAccount},
		"com.atproto.server.requestAccountDelete":           {true, s.hRequestAccountDelete},
		"com.atproto.server.deleteAccount":                  {true, s.hDeleteAccount},
		"com.atproto.identity.resolveHandle":                {false, s.hResolveHandle},
		"com.atproto.identity.updateHandle":                 {true, s.hUpdateHandle},
		"com.atproto.identity.getRecommendedDidCredentials": {false, s.hGetRecommendedDidCredentials},
		"com.atproto.identity.requestPlcOperationSignature": {true, s.hRequestPlcOperationSignature},
		"com.atproto.identity.signPlcOperation":             {true, s.hSignPlcOperation},
		"com.atproto.identity.submitPlcOperation":           {true, s.hSubmitPlcOperation},
		"com.atproto.repo.createRecord":                     {true, s.hCreateRecord},
		"com.atproto.repo.putRecord":                        {true, s.hPutRecord},
		"com.atproto.repo.deleteRecord":                     {true, s.hDeleteRecord},
		"com.atproto.repo.applyWrites":                      {true, s.hApplyWrites},
		"com.atproto.repo.getRecord":                        {false, s.hGetRecord},
		"com.atproto.repo.listRecords":                      {false, s.hListRecords},
		"com.atproto.repo.describeRepo":                     {false, s.hDescribeRepo},
		"com.atproto.repo.uploadBlob":                       {true, s.hUploadBlob},
		"com.atproto.repo.importRepo":                       {true, s.hImportRepo},
		"com.atproto.repo.listMissingBlobs":                 {false, s.hListMissingBlobs},
		"com.atproto.sync.listBlobs":                        {false, s.hListBlobs},
		"com.atproto.sync.getBlob":                          {false, nil},
		"com.atproto.sync.getLatestCommit":                  {false, s.hGetLatestCommit},
		"com.atproto.sync.listRepos":                        {false, s.hListRepos},
		"com.atproto.sync.getRepoStatus":                    {false, s.hGetRepoStatus},
		"com.atproto.sync.getRepo":                          {false, nil},
		"com.atproto.sync.getRecord":                        {false, nil},
		"com.atproto.sync.subscribeRepos":                   {false, nil},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/xrpc/_health", func(w http.ResponseWriter, r *http.Request) {
		xrpc.WriteJSON(w, 200, map[string]string{"version": "socialweb-pds"})
	})
	mux.HandleFunc("/.well-known/atproto-did", s.hWellKnownDID)
	mux.HandleFunc("/xrpc/com.atproto.sync.getRepo", s.hGetRepoCAR)
	mux.HandleFunc("/xrpc/com.atproto.sync.getRecord", s.hSyncGetRecord)
	mux.HandleFunc("/xrpc/com.atproto.sync.getBlob", s.hGetBlob)
	mux.HandleFunc("/xrpc/com.atproto.sync.subscribeRepos", s.hSubscribeRepos)
	mux.HandleFunc("/xrpc/", func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				s.log.Error("xrpc handler panic", "method", r.URL.Path, "panic", p)
				xrpc.WriteError(w, nil)
			}
		}()
		name := strings.TrimPrefix(r.URL.Path, "/xrpc/")
		// Before the body is read: see xrpc.LimitBody. uploadBlob streams its body under a
		// limit of its own (Config.BlobUploadLimit) and answers past it as the reference does;
		// importRepo reads up to Config.ImportLimit.
		if name != "com.atproto.repo.uploadBlob" && name != "com.atproto.repo.importRepo" {
			if xe := xrpc.LimitBody(w, r, MaxBodyBytes); xe != nil {
				xrpc.WriteError(w, xe)
				return
			}
		}
		h, ok := methods[name]
		if !ok || h.fn == nil {
			xrpc.WriteError(w, errNamed(http.StatusNotImplemented, xrpc.MethodNotImplemented, "Method Not Implemented"))
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
	if xe := xrpc.BodyTooLarge(err); xe != nil {
		return xe
	}
	if err != nil {
		return errInvalidRequest("could not read request body")
	}
	return decodeJSONBody(body, v)
}

func decodeJSONBody(body []byte, v any) error {
	if len(body) > MaxBodyBytes {
		return errNamed(http.StatusRequestEntityTooLarge, xrpc.PayloadTooLarge, "request entity too large")
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
	acct, err := s.accountOf(target)
	if err != nil {
		return "", errNamed(403, "AccountNotFound", "Account not found")
	}
	if active, _ := acct.status(); !active {
		return "", errNamed(401, "AccountDeactivated", "Account is deactivated")
	}
	if target != did {
		return "", errNamed(401, "AuthenticationRequired", "Authentication Required")
	}
	return did, nil
}

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

var _ = plc.TypeOperation
