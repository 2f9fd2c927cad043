package pds

import (
	"errors"
	"fmt"
	"strings"

	"github.com/bluesky-social/indigo/atproto/lexicon"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"socialweb.computer/internal/pds/stdlex"
)

// recordCheck is what the PDS does with one record it is asked to write, decided from the
// write's validate flag and whether the collection is a record type the PDS knows. The rules
// are the reference PDS's (repo/prepare.js):
//
//	validate   known             unknown
//	unset      checkValidate     checkUnknown
//	true       checkValidate     checkRefuse
//	false      checkNone         checkNone
type recordCheck int

const (
	// checkNone: stored as sent, no validationStatus in the answer.
	checkNone recordCheck = iota
	// checkUnknown: stored as sent, validationStatus "unknown".
	checkUnknown
	// checkValidate: the record key and the record are checked against the lexicon; a
	// mismatch is refused, a match stored with validationStatus "valid".
	checkValidate
	// checkRefuse: validation was asked for and no lexicon is known: refused.
	checkRefuse
)

func decideCheck(validate *bool, known bool) recordCheck {
	switch {
	case validate != nil && !*validate:
		return checkNone
	case known:
		return checkValidate
	case validate != nil:
		return checkRefuse
	default:
		return checkUnknown
	}
}

// layeredCatalog resolves a ref in the first catalog that has it: the project's lexicons
// (Config.Lexicons) before the standard set, so a project may define what the standard set
// does not and both resolve refs across each other.
type layeredCatalog []lexicon.Catalog

func (l layeredCatalog) Resolve(ref string) (*lexicon.Schema, error) {
	for _, c := range l {
		if s, err := c.Resolve(ref); err == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("schema not found in catalog: %s", ref)
}

// catalogFor puts the configured lexicons over the embedded standard set.
func catalogFor(project lexicon.Catalog) (lexicon.Catalog, error) {
	std, err := stdlex.Catalog()
	if err != nil {
		return nil, err
	}
	if project == nil {
		return std, nil
	}
	return layeredCatalog{project, std}, nil
}

// recordSchema returns the record lexicon of collection, or nil when none is known (no
// lexicon, or one that is not a record type: the reference knows only record types here).
func (s *Server) recordSchema(coll syntax.NSID) *lexicon.SchemaRecord {
	if s.lex == nil {
		return nil
	}
	sch, err := s.lex.Resolve(coll.String())
	if err != nil {
		return nil
	}
	rec, ok := sch.Def.(lexicon.SchemaRecord)
	if !ok {
		return nil
	}
	return &rec
}

// validateRecord decides and applies the check of one record write and returns its
// validationStatus ("valid", "unknown", or "" when validation was turned off).
func (s *Server) validateRecord(validate *bool, coll syntax.NSID, rkey syntax.RecordKey, val map[string]any) (string, error) {
	rec := s.recordSchema(coll)
	switch decideCheck(validate, rec != nil) {
	case checkNone:
		return "", nil
	case checkUnknown:
		return "unknown", nil
	case checkRefuse:
		return "", errInvalidRequest("Unknown lexicon type: %s", coll)
	}
	if err := checkRecordKey(rec.Key, rkey); err != nil {
		return "", errInvalidRequest("Invalid record key for %s: %v", coll, err)
	}
	if err := lexicon.ValidateRecord(s.lex, val, coll.String(), 0); err != nil {
		return "", errInvalidRequest("Invalid %s record: %v", coll, err)
	}
	return "valid", nil
}

// checkRecordKey checks a record key (already valid as a record key) against a lexicon's key
// type: "any", "tid", "nsid" or "literal:<value>".
func checkRecordKey(keyType string, rkey syntax.RecordKey) error {
	switch {
	case keyType == "any" || keyType == "":
		return nil
	case keyType == "tid":
		if _, err := syntax.ParseTID(rkey.String()); err != nil {
			return fmt.Errorf("invalid TID string (got %q)", rkey)
		}
		return nil
	case keyType == "nsid":
		if _, err := syntax.ParseNSID(rkey.String()); err != nil {
			return fmt.Errorf("invalid NSID string (got %q)", rkey)
		}
		return nil
	case strings.HasPrefix(keyType, "literal:"):
		if want := strings.TrimPrefix(keyType, "literal:"); rkey.String() != want {
			return fmt.Errorf("expected %q (got %q)", want, rkey)
		}
		return nil
	}
	return errors.New("unsupported record key type " + keyType)
}
