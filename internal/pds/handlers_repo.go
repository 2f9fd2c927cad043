package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

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
	w := Write{Action: action, Collection: in.Collection, RKey: in.RKey, Raw: in.Record, Validate: in.Validate}
	mode := modeBatch
	if action == ActionUpdate {
		// putRecord: swapRecord null means "must not exist", and the single-write mode.
		if w.SwapRecord, err = swapField(in.SwapRecord, true); err != nil {
			return nil, err
		}
		mode = modeSingle
	}
	commit, res, err := s.applyWrites(ctx, did, []Write{w}, deref(in.SwapCommit), mode)
	if err != nil {
		return nil, err
	}
	return recordOut{URI: res[0].URI, CID: res[0].CID, Commit: commit, ValidationStatus: res[0].ValidationStatus}, nil
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
		writes[i] = Write{Action: a, Collection: w.Collection, RKey: w.RKey, Raw: w.Value, Validate: in.Validate}
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
			if wr.ValidationStatus != "" {
				m["validationStatus"] = wr.ValidationStatus
			}
		}
		results[i] = m
	}
	return map[string]any{"commit": commit, "results": results}, nil
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
	did, acct, err := s.resolveRepo(p["repo"])
	if err != nil {
		return nil, errInvalidRequest("Could not locate record")
	}
	// The reference does not find a deactivated account here and, with no app view to
	// ask instead, answers as for an unknown repo.
	if active, _ := acct.status(); !active {
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
	did, acct, err := s.resolveRepo(p["repo"])
	if err == nil {
		if active, _ := acct.status(); !active {
			return nil, errInvalidRequest("Could not find repo: %s", p["repo"])
		}
	}
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
	if err := s.repoServed(r, p["repo"], acct); err != nil {
		return nil, err
	}
	colls, err := s.collections(did)
	if err != nil {
		return nil, err
	}
	var doc any
	if data, err := s.plc.Data(ctx, did); err == nil {
		doc = data.Document()
	}
	return map[string]any{"handle": acct.Handle, "did": did, "didDoc": doc, "collections": colls, "handleIsCorrect": true}, nil
}
