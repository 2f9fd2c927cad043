package pds

import "context"

// Repo is an in-process handle to one hosted account's repo, for controllers that run in the
// same process as the PDS. Its writes take the same path, and follow the same swap and no-op
// rules, as the XRPC endpoints.
type Repo struct {
	s   *Server
	DID string
}

// Repo returns a handle to did's repo (which need not exist yet: calls then fail with RepoNotFound).
func (s *Server) Repo(did string) *Repo { return &Repo{s: s, DID: did} }

// Get reads a record.
func (r *Repo) Get(ctx context.Context, collection, rkey string) (*Record, error) {
	return r.s.GetRecord(ctx, r.DID, collection, rkey)
}

// List pages through a collection (see Server.ListRecords).
func (r *Repo) List(ctx context.Context, collection string, limit int, cursor string, reverse bool) ([]Record, string, error) {
	return r.s.ListRecords(ctx, r.DID, collection, limit, cursor, reverse)
}

// Put creates or replaces a record, as putRecord. swap nil: unconditional; &Swap{} : the record
// must not exist; &Swap{CID: c}: the record must be at c. An unchanged record makes no commit
// (the returned CommitInfo is nil).
func (r *Repo) Put(ctx context.Context, collection, rkey string, record map[string]any, swap *Swap) (*CommitInfo, *WriteResult, error) {
	c, res, err := r.s.applyWrites(ctx, r.DID, []Write{{Action: ActionUpdate, Collection: collection, RKey: rkey, Record: record, SwapRecord: swap}}, "", modeSingle)
	if err != nil {
		return nil, nil, err
	}
	return c, &res[0], nil
}

// Create adds a record; an empty rkey takes a new TID.
func (r *Repo) Create(ctx context.Context, collection, rkey string, record map[string]any) (*CommitInfo, *WriteResult, error) {
	c, res, err := r.s.applyWrites(ctx, r.DID, []Write{{Action: ActionCreate, Collection: collection, RKey: rkey, Record: record}}, "", modeBatch)
	if err != nil {
		return nil, nil, err
	}
	return c, &res[0], nil
}

// Delete removes a record, as deleteRecord; deleting a missing record is a no-op (nil commit).
func (r *Repo) Delete(ctx context.Context, collection, rkey string, swap *Swap) (*CommitInfo, error) {
	c, _, err := r.s.applyWrites(ctx, r.DID, []Write{{Action: ActionDelete, Collection: collection, RKey: rkey, SwapRecord: swap}}, "", modeSingle)
	return c, err
}

// Apply runs several writes in one commit, as applyWrites; swapCommit "" skips the check.
func (r *Repo) Apply(ctx context.Context, writes []Write, swapCommit string) (*CommitInfo, []WriteResult, error) {
	return r.s.applyWrites(ctx, r.DID, writes, swapCommit, modeBatch)
}

// Head returns the repo's latest commit.
func (r *Repo) Head(ctx context.Context) (*CommitInfo, error) {
	h, err := r.s.head(r.DID)
	if err != nil {
		return nil, err
	}
	return &CommitInfo{CID: h.Commit, Rev: h.Rev}, nil
}

// Account resolves a hosted account by handle or DID and returns its DID and handle; an
// unknown account is the XRPC error RepoNotFound (or InvalidRequest for a bad identifier).
func (s *Server) Account(_ context.Context, ident string) (did, handle string, err error) {
	did, acct, err := s.resolveRepo(ident)
	if err != nil {
		return "", "", err
	}
	return did, acct.Handle, nil
}
