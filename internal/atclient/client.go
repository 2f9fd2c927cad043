// Package atclient is the XRPC client every controller uses to reach any PDS, ours or another:
// password sessions that refresh themselves, record reads and writes with compare-and-swap,
// typed errors, service-auth tokens and a firehose consumer that resumes from a cursor.
//
// It posts its own input structs rather than indigo's generated ones: those send
// "swapRecord": null for an unset swap, which a PDS reads as "the record must not exist".
// Here a swap is explicit: nil means no condition, Swap{} means must-not-exist, Swap{CID} means
// must-be-at.
package atclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"socialweb.computer/internal/xrpc"
)

// XRPCError is an error answer from a PDS, as xrpc.Decode reads it.
type XRPCError struct {
	Status  int
	Name    string
	Message string
}

func (e *XRPCError) Error() string {
	return fmt.Sprintf("xrpc %d %s: %s", e.Status, e.Name, e.Message)
}

// IsXRPC reports whether err is an XRPC error with the given name.
func IsXRPC(err error, name string) bool {
	var xe *XRPCError
	return errors.As(err, &xe) && xe.Name == name
}

// InvalidSwap reports whether err is a refused compare-and-swap.
func InvalidSwap(err error) bool { return IsXRPC(err, xrpc.InvalidSwap) }

// RecordNotFound reports whether err says the record does not exist.
func RecordNotFound(err error) bool { return IsXRPC(err, xrpc.RecordNotFound) }

// Client talks to one PDS. The zero Session is anonymous; Login fills it.
type Client struct {
	Host string // base URL, e.g. http://127.0.0.1:2583
	HTTP *http.Client

	mu      sync.Mutex
	session *Session
}

// Session is a logged-in account.
type Session struct {
	DID        string `json:"did"`
	Handle     string `json:"handle"`
	AccessJwt  string `json:"accessJwt"`
	RefreshJwt string `json:"refreshJwt"`
}

// New returns a client for host.
func New(host string) *Client {
	return &Client{Host: strings.TrimRight(host, "/"), HTTP: &http.Client{}}
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// Session returns the current session, or nil.
func (c *Client) Session() *Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.session == nil {
		return nil
	}
	s := *c.session
	return &s
}

// DID is the logged-in account's DID.
func (c *Client) DID() string {
	if s := c.Session(); s != nil {
		return s.DID
	}
	return ""
}

type authKind int

const (
	authNone authKind = iota
	authAccess
	authRefresh
)

// do performs one XRPC call. in is JSON-encoded for a procedure (POST) when not nil; out is
// decoded when not nil. With authAccess an ExpiredToken answer refreshes the session once.
func (c *Client) do(ctx context.Context, method, nsid string, params url.Values, in, out any, ak authKind) error {
	err := c.doOnce(ctx, method, nsid, params, in, out, ak)
	if ak == authAccess && IsXRPC(err, "ExpiredToken") {
		if rerr := c.Refresh(ctx); rerr != nil {
			return fmt.Errorf("%w (refresh failed: %v)", err, rerr)
		}
		return c.doOnce(ctx, method, nsid, params, in, out, ak)
	}
	return err
}

func (c *Client) doOnce(ctx context.Context, method, nsid string, params url.Values, in, out any, ak authKind) error {
	u := c.Host + "/xrpc/" + nsid
	if len(params) > 0 {
		u += "?" + params.Encode()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if ak != authNone {
		s := c.Session()
		if s == nil {
			return errors.New("atclient: not logged in")
		}
		tok := s.AccessJwt
		if ak == authRefresh {
			tok = s.RefreshJwt
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		xe := &XRPCError{Status: resp.StatusCode}
		if e, ok := xrpc.Decode(resp.StatusCode, resp.Header, raw); ok {
			xe.Name, xe.Message = e.Name, e.Message
		} else {
			xe.Name, xe.Message = http.StatusText(resp.StatusCode), strings.TrimSpace(string(raw))
		}
		return xe
	}
	if out == nil {
		return nil
	}
	if b, ok := out.(*[]byte); ok {
		*b = raw
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("atclient: decoding %s answer: %w", nsid, err)
	}
	return nil
}

// CreateAccount creates an account and logs in as it, on a PDS that needs no invite code.
func (c *Client) CreateAccount(ctx context.Context, handle, password, email string) (*Session, error) {
	return c.CreateAccountWithInvite(ctx, handle, password, email, "")
}

// CreateAccountWithInvite creates an account with an invite code (a PDS that requires one
// refuses a missing or spent code with InvalidInviteCode) and logs in as it.
func (c *Client) CreateAccountWithInvite(ctx context.Context, handle, password, email, inviteCode string) (*Session, error) {
	in := map[string]string{"handle": handle, "password": password}
	if email != "" {
		in["email"] = email
	}
	if inviteCode != "" {
		in["inviteCode"] = inviteCode
	}
	var s Session
	if err := c.do(ctx, "POST", "com.atproto.server.createAccount", nil, in, &s, authNone); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.session = &s
	c.mu.Unlock()
	return &s, nil
}

// Login creates a session with a handle (or DID) and password.
func (c *Client) Login(ctx context.Context, identifier, password string) (*Session, error) {
	var s Session
	err := c.do(ctx, "POST", "com.atproto.server.createSession", nil,
		map[string]string{"identifier": identifier, "password": password}, &s, authNone)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.session = &s
	c.mu.Unlock()
	return &s, nil
}

// Refresh trades the refresh token for a new session.
func (c *Client) Refresh(ctx context.Context) error {
	var s Session
	if err := c.doOnce(ctx, "POST", "com.atproto.server.refreshSession", nil, nil, &s, authRefresh); err != nil {
		return err
	}
	c.mu.Lock()
	c.session = &s
	c.mu.Unlock()
	return nil
}

// Logout revokes the refresh token.
func (c *Client) Logout(ctx context.Context) error {
	err := c.doOnce(ctx, "POST", "com.atproto.server.deleteSession", nil, nil, nil, authRefresh)
	c.mu.Lock()
	c.session = nil
	c.mu.Unlock()
	return err
}

// GetSession asks the PDS who the session is.
func (c *Client) GetSession(ctx context.Context) (*Session, error) {
	var s Session
	err := c.do(ctx, "GET", "com.atproto.server.getSession", nil, nil, &s, authAccess)
	return &s, err
}

// Swap is a compare-and-swap condition: CID "" means the record must not exist.
type Swap struct{ CID string }

// Commit names a commit.
type Commit struct {
	CID string `json:"cid"`
	Rev string `json:"rev"`
}

// WriteResult is a put or create answer. Commit is nil when the write changed nothing.
type WriteResult struct {
	URI              string  `json:"uri"`
	CID              string  `json:"cid"`
	Commit           *Commit `json:"commit,omitempty"`
	ValidationStatus string  `json:"validationStatus,omitempty"`
}

type putInput struct {
	Repo       string           `json:"repo"`
	Collection string           `json:"collection"`
	RKey       string           `json:"rkey"`
	Record     any              `json:"record"`
	SwapRecord *json.RawMessage `json:"swapRecord,omitempty"`
	SwapCommit string           `json:"swapCommit,omitempty"`
}

func swapJSON(s *Swap) *json.RawMessage {
	if s == nil {
		return nil
	}
	var raw json.RawMessage
	if s.CID == "" {
		raw = json.RawMessage("null")
	} else {
		raw, _ = json.Marshal(s.CID)
	}
	return &raw
}

// PutRecord creates or replaces a record in the session's repo.
func (c *Client) PutRecord(ctx context.Context, collection, rkey string, record any, swap *Swap) (*WriteResult, error) {
	var out WriteResult
	err := c.do(ctx, "POST", "com.atproto.repo.putRecord", nil, putInput{Repo: c.DID(), Collection: collection,
		RKey: rkey, Record: record, SwapRecord: swapJSON(swap)}, &out, authAccess)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateRecord adds a record; rkey "" lets the PDS pick a TID.
func (c *Client) CreateRecord(ctx context.Context, collection, rkey string, record any) (*WriteResult, error) {
	in := map[string]any{"repo": c.DID(), "collection": collection, "record": record}
	if rkey != "" {
		in["rkey"] = rkey
	}
	var out WriteResult
	if err := c.do(ctx, "POST", "com.atproto.repo.createRecord", nil, in, &out, authAccess); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteRecord removes a record; swap must be nil or carry a CID (deleteRecord has no
// must-not-exist form). The commit is nil when there was nothing to delete.
func (c *Client) DeleteRecord(ctx context.Context, collection, rkey string, swap *Swap) (*Commit, error) {
	in := map[string]any{"repo": c.DID(), "collection": collection, "rkey": rkey}
	if swap != nil {
		in["swapRecord"] = swap.CID
	}
	var out struct {
		Commit *Commit `json:"commit"`
	}
	if err := c.do(ctx, "POST", "com.atproto.repo.deleteRecord", nil, in, &out, authAccess); err != nil {
		return nil, err
	}
	return out.Commit, nil
}

// Record is a record as read back.
type Record struct {
	URI   string          `json:"uri"`
	CID   string          `json:"cid"`
	Value json.RawMessage `json:"value"`
}

// GetRecord reads a record from any repo (repo "" is the session's).
func (c *Client) GetRecord(ctx context.Context, repo, collection, rkey string) (*Record, error) {
	if repo == "" {
		repo = c.DID()
	}
	var out Record
	err := c.do(ctx, "GET", "com.atproto.repo.getRecord", url.Values{"repo": {repo}, "collection": {collection}, "rkey": {rkey}}, nil, &out, authNone)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// ListRecords pages through a collection.
func (c *Client) ListRecords(ctx context.Context, repo, collection string, limit int, cursor string, reverse bool) ([]Record, string, error) {
	if repo == "" {
		repo = c.DID()
	}
	p := url.Values{"repo": {repo}, "collection": {collection}}
	if limit > 0 {
		p.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		p.Set("cursor", cursor)
	}
	if reverse {
		p.Set("reverse", "true")
	}
	var out struct {
		Records []Record `json:"records"`
		Cursor  string   `json:"cursor"`
	}
	if err := c.do(ctx, "GET", "com.atproto.repo.listRecords", p, nil, &out, authNone); err != nil {
		return nil, "", err
	}
	return out.Records, out.Cursor, nil
}

// GetServiceAuth asks the PDS for a service-auth token for aud (and lxm, when not "").
// expSeconds 0 takes the PDS's default (60 s).
func (c *Client) GetServiceAuth(ctx context.Context, aud, lxm string, expUnix int64) (string, error) {
	p := url.Values{"aud": {aud}}
	if lxm != "" {
		p.Set("lxm", lxm)
	}
	if expUnix > 0 {
		p.Set("exp", strconv.FormatInt(expUnix, 10))
	}
	var out struct {
		Token string `json:"token"`
	}
	if err := c.do(ctx, "GET", "com.atproto.server.getServiceAuth", p, nil, &out, authAccess); err != nil {
		return "", err
	}
	return out.Token, nil
}

// GetLatestCommit reads a repo's head.
func (c *Client) GetLatestCommit(ctx context.Context, did string) (*Commit, error) {
	var out Commit
	if err := c.do(ctx, "GET", "com.atproto.sync.getLatestCommit", url.Values{"did": {did}}, nil, &out, authNone); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetRepo downloads a repo as a CAR.
func (c *Client) GetRepo(ctx context.Context, did string) ([]byte, error) {
	var out []byte
	err := c.do(ctx, "GET", "com.atproto.sync.getRepo", url.Values{"did": {did}}, nil, &out, authNone)
	return out, err
}

// SyncGetRecord downloads a record with its MST proof as a CAR.
func (c *Client) SyncGetRecord(ctx context.Context, did, collection, rkey string) ([]byte, error) {
	var out []byte
	err := c.do(ctx, "GET", "com.atproto.sync.getRecord", url.Values{"did": {did}, "collection": {collection}, "rkey": {rkey}}, nil, &out, authNone)
	return out, err
}

// Call performs any XRPC call: a procedure when in is not nil, else a query.
func (c *Client) Call(ctx context.Context, nsid string, params url.Values, in, out any, authed bool) error {
	method := "GET"
	if in != nil {
		method = "POST"
	}
	ak := authNone
	if authed {
		ak = authAccess
	}
	return c.do(ctx, method, nsid, params, in, out, ak)
}
