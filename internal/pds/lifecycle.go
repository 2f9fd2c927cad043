package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/ipfs/go-cid"
	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/firehose"
)

// Account status values, as the #account firehose event and getRepoStatus name them.
const (
	StatusDeactivated = "deactivated"
	StatusDeleted     = "deleted"
)

// status is the account's (active, status) pair as the reference reports it: status is empty
// while the account is active.
func (a *account) status() (bool, string) {
	if !a.Active {
		return false, StatusDeactivated
	}
	return true, ""
}

// accountEvent builds the #account frame the reference sequences: active accounts carry no
// status.
func accountEvent(did string, active bool, status string) func(seq int64) cborBody {
	return func(seq int64) cborBody {
		ev := &comatproto.SyncSubscribeRepos_Account{Did: did, Active: active, Seq: seq, Time: nowString()}
		if !active {
			st := status
			ev.Status = &st
		}
		return ev
	}
}

// frameAdder returns a function that encodes one event with the next seq and appends it to
// *frames, for use inside storeTx.
func frameAdder(nextSeq func() (int64, error), frames *[]storedFrame) func(typ string, mk func(seq int64) cborBody) error {
	return func(typ string, mk func(seq int64) cborBody) error {
		seq, err := nextSeq()
		if err != nil {
			return err
		}
		b, err := firehose.Encode(typ, mk(seq))
		if err != nil {
			return err
		}
		*frames = append(*frames, storedFrame{seq: seq, typ: typ, data: b})
		return nil
	}
}

func putAccount(tx *bolt.Tx, a *account) error {
	raw, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return tx.Bucket(bAccounts).Put([]byte(a.DID), raw)
}

// DeactivateAccount marks did deactivated and emits #account (active false, status
// deactivated). Its repo is then served to nobody but itself, and its writes are refused
// (AccountDeactivated); its sessions still work, so that it can activate again. Deactivating
// twice emits the event twice, as the reference does.
func (s *Server) DeactivateAccount(_ context.Context, did string) error {
	s.acctMu.Lock()
	defer s.acctMu.Unlock()
	return s.storeTx(func(tx *bolt.Tx, nextSeq func() (int64, error)) ([]storedFrame, error) {
		acct, err := getAccount(tx, did)
		if err != nil {
			return nil, errInvalidRequest("Account not found")
		}
		if acct.Active {
			now := time.Now().UTC()
			acct.Active, acct.DeactivatedAt = false, &now
			if err := putAccount(tx, acct); err != nil {
				return nil, err
			}
		}
		var frames []storedFrame
		add := frameAdder(nextSeq, &frames)
		if err := add(firehose.TypeAccount, accountEvent(did, false, StatusDeactivated)); err != nil {
			return nil, err
		}
		return frames, nil
	})
}

// ActivateAccount ends a deactivation. As the reference, it first checks that the DID
// document still names this server (else the account would be served from a PDS the network
// does not point at), then emits #account (active), #identity and #sync with the current
// commit, so that relays that dropped the repo pick it up again; and asks the relays to crawl
// (an account moved in may be the first they hear of this server), as the reference's
// sequencer does after every event.
func (s *Server) ActivateAccount(ctx context.Context, did string) error {
	if err := s.checkDIDDoc(ctx, did); err != nil {
		return err
	}
	rs, err := s.repoFor(did)
	if err != nil {
		return err
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.deleted {
		return errNamed(400, "AccountNotFound", "user not found")
	}
	s.acctMu.Lock()
	defer s.acctMu.Unlock()
	err = s.storeTx(func(tx *bolt.Tx, nextSeq func() (int64, error)) ([]storedFrame, error) {
		acct, err := getAccount(tx, did)
		if err != nil {
			return nil, errNamed(400, "AccountNotFound", "user not found")
		}
		acct.Active, acct.DeactivatedAt = true, nil
		if err := putAccount(tx, acct); err != nil {
			return nil, err
		}
		commitBlock := tx.Bucket(bBlocks).Get(repoKey(did, rs.head.Bytes()))
		if commitBlock == nil {
			return nil, errNamed(500, "InternalServerError", "commit block of %s missing", did)
		}
		commitBlock = append([]byte(nil), commitBlock...)
		syncCAR, err := writeCAR(rs.head, []cid.Cid{rs.head}, func(cid.Cid) []byte { return commitBlock })
		if err != nil {
			return nil, err
		}
		var frames []storedFrame
		add := frameAdder(nextSeq, &frames)
		h := acct.Handle
		rev := rs.rev
		if err := add(firehose.TypeAccount, accountEvent(did, true, "")); err != nil {
			return nil, err
		}
		if err := add(firehose.TypeIdentity, func(seq int64) cborBody {
			return &comatproto.SyncSubscribeRepos_Identity{Did: did, Handle: &h, Seq: seq, Time: nowString()}
		}); err != nil {
			return nil, err
		}
		if err := add(firehose.TypeSync, func(seq int64) cborBody {
			return &comatproto.SyncSubscribeRepos_Sync{Did: did, Blocks: syncCAR, Rev: rev, Seq: seq, Time: nowString()}
		}); err != nil {
			return nil, err
		}
		return frames, nil
	})
	if err == nil {
		s.crawl.notify()
	}
	return err
}

// checkDIDDoc is the reference's assertValidDidDocumentForService: the DID's current PLC
// data must keep this server's rotation key, name this server as its PDS and carry the
// account's signing key.
func (s *Server) checkDIDDoc(ctx context.Context, did string) error {
	acct, err := s.accountOf(did)
	if err != nil {
		return err
	}
	last, err := s.plc.Last(ctx, did)
	if err != nil {
		return errInvalidRequest("Could not resolve DID: %v", err)
	}
	rotPub, err := s.rotationKey.PublicKey()
	if err != nil {
		return err
	}
	found := false
	for _, k := range last.RotationKeys {
		found = found || k == rotPub.DIDKey()
	}
	if !found {
		return errInvalidRequest("Server rotation key not included in PLC DID data")
	}
	if svc, ok := last.Services["atproto_pds"]; !ok || svc.Endpoint != s.url {
		return errInvalidRequest("DID document atproto_pds service endpoint does not match PDS public url")
	}
	key, err := atcrypto.ParsePrivateBytesK256(acct.SigningKey)
	if err != nil {
		return err
	}
	pub, err := key.PublicKey()
	if err != nil {
		return err
	}
	if last.VerificationMethods["atproto"] != pub.DIDKey() {
		return errInvalidRequest("DID document verification method does not match expected signing key")
	}
	return nil
}

// CheckAccountStatus reports what the reference's checkAccountStatus reports: whether the
// account is active, whether its DID document points here, and the counts of what its repo
// holds (expectedBlobs: distinct blobs its records reference; importedBlobs: blobs stored).
func (s *Server) CheckAccountStatus(ctx context.Context, did string) (*comatproto.ServerCheckAccountStatus_Output, error) {
	h, err := s.head(did)
	if err != nil {
		return nil, err
	}
	out := &comatproto.ServerCheckAccountStatus_Output{RepoCommit: h.Commit, RepoRev: h.Rev}
	prefix := repoKey(did, nil)
	count := func(tx *bolt.Tx, b []byte) int64 {
		var n int64
		c := tx.Bucket(b).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			n++
		}
		return n
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		acct, err := getAccount(tx, did)
		if err != nil {
			return err
		}
		out.Activated, _ = acct.status()
		out.RepoBlocks = count(tx, bBlocks)
		out.IndexedRecords = count(tx, bRecords)
		out.ImportedBlobs = count(tx, bBlobs)
		// bBlobRefs keys are did\0cid\0path: count the distinct cids.
		var last []byte
		c := tx.Bucket(bBlobRefs).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			rest := k[len(prefix):]
			if i := bytes.IndexByte(rest, 0); i >= 0 {
				rest = rest[:i]
			}
			if !bytes.Equal(rest, last) {
				out.ExpectedBlobs++
				last = append(last[:0], rest...)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out.ValidDid = s.checkDIDDoc(ctx, did) == nil
	return out, nil
}

func (s *Server) hCheckAccountStatus(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	return s.CheckAccountStatus(ctx, did)
}

func (s *Server) hDeactivateAccount(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	var in struct {
		DeleteAfter *string `json:"deleteAfter"`
	}
	if r.ContentLength != 0 {
		if err := decodeInput(r, &in); err != nil {
			return nil, err
		}
	}
	return nil, s.DeactivateAccount(ctx, did)
}

func (s *Server) hActivateAccount(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	return nil, s.ActivateAccount(ctx, did)
}

// repoServed is the reference's assertRepoAvailability for the sync and describe endpoints:
// a deactivated repo is served only to its own account.
func (s *Server) repoServed(r *http.Request, did string, acct *account) error {
	if active, _ := acct.status(); active {
		return nil
	}
	if self, err := s.authAccess(r); err == nil && self == did {
		return nil
	}
	return errNamed(400, "RepoDeactivated", "Repo has been deactivated: %s", did)
}

// repoServedByDID looks did up and applies repoServed.
func (s *Server) repoServedByDID(r *http.Request, did string) error {
	acct, err := s.accountOf(did)
	if err != nil {
		return err
	}
	return s.repoServed(r, did, acct)
}
