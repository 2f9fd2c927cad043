package pds

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"sort"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Invite codes, as the reference PDS has them: an admin (HTTP Basic "admin" and the admin
// password) creates codes with a use count, createAccount spends one use, and an account
// lists the codes made for it. A code is "<hostname with dashes>-xxxxx-xxxxx" in base32.

// inviteCode is one stored code with its uses.
type inviteCode struct {
	Code       string      `json:"code"`
	Available  int         `json:"available"` // uses the code allows in all
	Disabled   bool        `json:"disabled"`
	ForAccount string      `json:"forAccount"`
	CreatedBy  string      `json:"createdBy"`
	CreatedAt  string      `json:"createdAt"`
	Uses       []inviteUse `json:"uses"`
}

type inviteUse struct {
	UsedBy string `json:"usedBy"`
	UsedAt string `json:"usedAt"`
}

// InvitesRequired says whether createAccount over XRPC needs an invite code.
func (s *Server) InvitesRequired() bool { return !s.cfg.OpenSignup }

// errInvite is the reference PDS's refusal of a missing or spent code.
func errInvite(msg string) *XRPCError { return errNamed(400, "InvalidInviteCode", "%s", msg) }

var inviteEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// newInviteCode makes a code like the reference's genInvCode.
func (s *Server) newInviteCode() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	tok := strings.ToLower(inviteEncoding.EncodeToString(b))[:10]
	return strings.ReplaceAll(s.cfg.Hostname, ".", "-") + "-" + tok[:5] + "-" + tok[5:]
}

// CreateInviteCodes stores count codes for each of forAccounts (none: "admin"), each good for
// useCount accounts, and returns them per account in that order. It is what
// createInviteCodes does for an admin; in-process callers use it directly.
func (s *Server) CreateInviteCodes(_ context.Context, count, useCount int, forAccounts []string) ([][]string, error) {
	if count < 1 {
		return nil, errInvalidRequest("codeCount must be at least 1")
	}
	if useCount < 1 {
		return nil, errInvalidRequest("useCount must be at least 1")
	}
	if len(forAccounts) == 0 {
		forAccounts = []string{"admin"}
	}
	now := nowString()
	out := make([][]string, len(forAccounts))
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bInvites)
		for i, acct := range forAccounts {
			for range count {
				c := inviteCode{Code: s.newInviteCode(), Available: useCount, ForAccount: acct, CreatedBy: "admin", CreatedAt: now, Uses: []inviteUse{}}
				raw, _ := json.Marshal(c)
				if err := b.Put([]byte(c.Code), raw); err != nil {
					return err
				}
				out[i] = append(out[i], c.Code)
			}
		}
		return nil
	})
	return out, err
}

// CreateInviteCode stores one code good for useCount accounts.
func (s *Server) CreateInviteCode(ctx context.Context, useCount int, forAccount string) (string, error) {
	var accts []string
	if forAccount != "" {
		accts = []string{forAccount}
	}
	codes, err := s.CreateInviteCodes(ctx, 1, useCount, accts)
	if err != nil {
		return "", err
	}
	return codes[0][0], nil
}

// checkInvite refuses a code that is unknown, disabled or used up, with the reference's
// messages. It runs before the account is made; spendInvite records the use after.
func (s *Server) checkInvite(code string) error {
	if !s.InvitesRequired() {
		return nil
	}
	if code == "" {
		return errInvite("No invite code provided")
	}
	return s.db.View(func(tx *bolt.Tx) error {
		_, err := availableInvite(tx, code)
		return err
	})
}

func availableInvite(tx *bolt.Tx, code string) (*inviteCode, error) {
	raw := tx.Bucket(bInvites).Get([]byte(code))
	if raw == nil {
		return nil, errInvite("Provided invite code not available")
	}
	var c inviteCode
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	if c.Disabled || len(c.Uses) >= c.Available {
		return nil, errInvite("Provided invite code not available")
	}
	return &c, nil
}

// spendInvite records did's use of code inside the account's creating transaction, so two
// sign-ups racing for a code's last use cannot both commit.
func spendInvite(tx *bolt.Tx, code, did string) error {
	c, err := availableInvite(tx, code)
	if err != nil {
		return err
	}
	c.Uses = append(c.Uses, inviteUse{UsedBy: did, UsedAt: nowString()})
	raw, _ := json.Marshal(c)
	return tx.Bucket(bInvites).Put([]byte(code), raw)
}

// accountInviteCodes are the codes made for did (ForAccount), oldest first; used-up codes only
// with includeUsed, disabled ones never (as getAccountInviteCodes answers).
func (s *Server) accountInviteCodes(did string, includeUsed bool) ([]inviteCode, error) {
	var out []inviteCode
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bInvites).ForEach(func(_, v []byte) error {
			var c inviteCode
			if err := json.Unmarshal(v, &c); err != nil {
				return err
			}
			if c.ForAccount != did || c.Disabled || (!includeUsed && len(c.Uses) >= c.Available) {
				return nil
			}
			out = append(out, c)
			return nil
		})
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt < out[j].CreatedAt })
	return out, err
}

// authAdmin checks HTTP Basic "admin:<AdminPassword>" as the reference's adminToken does.
// With no admin password configured nobody is admin.
func (s *Server) authAdmin(r *http.Request) error {
	refused := errNamed(401, "AuthenticationRequired", "Authentication Required")
	if s.cfg.AdminPassword == "" {
		return refused
	}
	typ, b64, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(typ, "Basic") {
		return refused
	}
	dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil {
		return refused
	}
	user, pw, ok := strings.Cut(string(dec), ":")
	if !ok || user != "admin" || subtle.ConstantTimeCompare([]byte(pw), []byte(s.cfg.AdminPassword)) != 1 {
		return refused
	}
	return nil
}

func (s *Server) hCreateInviteCode(ctx context.Context, r *http.Request) (any, error) {
	if err := s.authAdmin(r); err != nil {
		return nil, err
	}
	var in struct {
		UseCount   *int   `json:"useCount"`
		ForAccount string `json:"forAccount"`
	}
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	if in.UseCount == nil {
		return nil, errInvalidRequest("Missing required key \"useCount\" at $")
	}
	code, err := s.CreateInviteCode(ctx, *in.UseCount, in.ForAccount)
	if err != nil {
		return nil, err
	}
	return map[string]string{"code": code}, nil
}

func (s *Server) hCreateInviteCodes(ctx context.Context, r *http.Request) (any, error) {
	if err := s.authAdmin(r); err != nil {
		return nil, err
	}
	var in struct {
		CodeCount   *int     `json:"codeCount"`
		UseCount    *int     `json:"useCount"`
		ForAccounts []string `json:"forAccounts"`
	}
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	if in.CodeCount == nil || in.UseCount == nil {
		return nil, errInvalidRequest("Missing required keys \"codeCount\" and \"useCount\" at $")
	}
	if *in.CodeCount > 1000 {
		return nil, errInvalidRequest("codeCount must be at most 1000")
	}
	accts := in.ForAccounts
	if len(accts) == 0 {
		accts = []string{"admin"}
	}
	codes, err := s.CreateInviteCodes(ctx, *in.CodeCount, *in.UseCount, accts)
	if err != nil {
		return nil, err
	}
	type accountCodes struct {
		Account string   `json:"account"`
		Codes   []string `json:"codes"`
	}
	out := make([]accountCodes, len(accts))
	for i, a := range accts {
		out[i] = accountCodes{Account: a, Codes: codes[i]}
	}
	return map[string]any{"codes": out}, nil
}

func (s *Server) hGetAccountInviteCodes(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	includeUsed := r.URL.Query().Get("includeUsed") != "false" // the lexicon's default is true
	codes, err := s.accountInviteCodes(did, includeUsed)
	if err != nil {
		return nil, err
	}
	if codes == nil {
		codes = []inviteCode{}
	}
	return map[string]any{"codes": codes}, nil
}
