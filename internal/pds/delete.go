package pds

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base32"
	"encoding/json"
	"net/http"
	"time"

	"github.com/ipfs/go-cid"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/crypto/bcrypt"

	"socialweb.computer/internal/firehose"
)

// deleteTokenTTL is how long an account deletion token is good for, as the reference's
// email tokens.
const deleteTokenTTL = 15 * time.Minute

const purposeDeleteAccount = "delete_account"

// accountToken is a one-use token for an account operation (bTokens, keyed did\0purpose).
type accountToken struct {
	Token       string    `json:"token"`
	RequestedAt time.Time `json:"requestedAt"`
}

// newAccountToken makes a token in the reference's form: ten base32 characters, XXXXX-XXXXX.
func newAccountToken() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	t := base32.StdEncoding.EncodeToString(b)[:10]
	return t[:5] + "-" + t[5:]
}

// RequestAccountDelete makes (replacing any earlier one) the token deleteAccount asks for,
// good for 15 minutes. The reference mails it to the account's email address; this server
// sends no email, so the in-process caller (the operator) hands it over.
func (s *Server) RequestAccountDelete(_ context.Context, did string) (string, error) {
	return s.issueAccountToken(did, purposeDeleteAccount)
}

func (s *Server) hRequestAccountDelete(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	acct, err := s.accountOf(did)
	if err != nil {
		return nil, errInvalidRequest("account not found")
	}
	if acct.Email == "" {
		return nil, errInvalidRequest("account does not have an email address")
	}
	// Making a token nobody receives would only look like success.
	return nil, errInvalidRequest("this server sends no email: ask its operator for an account deletion token")
}

func (s *Server) hDeleteAccount(ctx context.Context, r *http.Request) (any, error) {
	var in struct {
		DID      *string `json:"did"`
		Password *string `json:"password"`
		Token    *string `json:"token"`
	}
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		v    *string
	}{{"did", in.DID}, {"password", in.Password}, {"token", in.Token}} {
		if f.v == nil {
			return nil, errInvalidRequest("Missing required key %q at $", f.name)
		}
	}
	did := *in.DID
	var acct *account
	var tok *accountToken
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		if acct, err = getAccount(tx, did); err != nil {
			return errInvalidRequest("account not found")
		}
		if raw := tx.Bucket(bTokens).Get(repoKey(did, []byte(purposeDeleteAccount))); raw != nil {
			tok = new(accountToken)
			return json.Unmarshal(raw, tok)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if bcrypt.CompareHashAndPassword(acct.PasswordHash, []byte(*in.Password)) != nil {
		return nil, errNamed(401, "AuthenticationRequired", "Invalid did or password")
	}
	if tok == nil || subtle.ConstantTimeCompare([]byte(tok.Token), []byte(*in.Token)) != 1 {
		return nil, errNamed(400, "InvalidToken", "Token is invalid")
	}
	if s.now().Sub(tok.RequestedAt) > deleteTokenTTL {
		return nil, errNamed(400, "ExpiredToken", "Token is expired")
	}
	return nil, s.DeleteAccount(ctx, did)
}

// DeleteAccount removes did and everything the server holds for it, as the reference's
// deleteAccount: the account, its handle, sessions and tokens, its repo (head, blocks, record
// index), its blobs (metadata, references and bytes), and its earlier firehose events; one
// #account {active: false, status: deleted} event is left in their place, so that relays drop
// the repo. The DID stays in the PLC directory, as the reference leaves it.
func (s *Server) DeleteAccount(ctx context.Context, did string) error {
	rs, err := s.repoFor(did)
	if err != nil {
		return err
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	s.acctMu.Lock()
	defer s.acctMu.Unlock()
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	prefix := repoKey(did, nil)
	var blobs []cid.Cid
	err = s.storeTx(func(tx *bolt.Tx, nextSeq func() (int64, error)) ([]storedFrame, error) {
		acct, err := getAccount(tx, did)
		if err != nil {
			return nil, errInvalidRequest("account not found")
		}
		c := tx.Bucket(bBlobs).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			if bc, err := cid.Decode(string(k[len(prefix):])); err == nil {
				blobs = append(blobs, bc)
			}
		}
		for _, b := range [][]byte{bBlocks, bRecords, bBlobs, bBlobRefs, bRecordBlobs, bTokens} {
			if err := deletePrefix(tx.Bucket(b), prefix); err != nil {
				return nil, err
			}
		}
		if err := deleteWhere(tx.Bucket(bSessions), func(_, v []byte) bool {
			var ses session
			return json.Unmarshal(v, &ses) == nil && ses.DID == did
		}); err != nil {
			return nil, err
		}
		// The reference keeps only the deletion event of a deleted account.
		if err := deleteWhere(tx.Bucket(bEvents), func(_, v []byte) bool {
			ev, err := firehose.Decode(v)
			return err == nil && ev.DID() == did
		}); err != nil {
			return nil, err
		}
		for _, b := range [][]byte{bRepos, bAccounts} {
			if err := tx.Bucket(b).Delete([]byte(did)); err != nil {
				return nil, err
			}
		}
		if err := tx.Bucket(bHandles).Delete([]byte(acct.Handle)); err != nil {
			return nil, err
		}
		var frames []storedFrame
		if err := frameAdder(nextSeq, &frames)(firehose.TypeAccount, accountEvent(did, false, StatusDeleted)); err != nil {
			return nil, err
		}
		return frames, nil
	})
	if err != nil {
		return err
	}
	rs.deleted = true
	s.reposMu.Lock()
	delete(s.repos, did)
	s.reposMu.Unlock()
	// The rows are gone, so a failure here leaves unreachable bytes, not a half account.
	for _, c := range blobs {
		if err := s.blobs.Delete(ctx, did, c); err != nil {
			s.log.Warn("deleting a blob of a deleted account", "did", did, "cid", c.String(), "err", err)
		}
	}
	s.log.Info("account deleted", "did", did)
	return nil
}

func deletePrefix(b *bolt.Bucket, prefix []byte) error {
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		keys = append(keys, append([]byte(nil), k...))
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// deleteWhere deletes the keys of b that match; keys are collected first, as bbolt does not
// allow deleting under a ForEach.
func deleteWhere(b *bolt.Bucket, match func(k, v []byte) bool) error {
	var keys [][]byte
	if err := b.ForEach(func(k, v []byte) error {
		if match(k, v) {
			keys = append(keys, append([]byte(nil), k...))
		}
		return nil
	}); err != nil {
		return err
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
