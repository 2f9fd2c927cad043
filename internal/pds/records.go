package pds

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"

	"socialweb.computer/internal/xrpc"
)

// MaxRecordBytes is the largest record, in DAG-CBOR, a write accepts.
const MaxRecordBytes = atdata.MAX_CBOR_RECORD_SIZE

var cidBuilder = cid.V1Builder{Codec: cid.DagCBOR, MhType: multihash.SHA2_256}

// encodedRecord is a record ready to be stored: its canonical bytes and their CID.
type encodedRecord struct {
	cid   cid.Cid
	bytes []byte
	value map[string]any
}

// parseCollection validates an NSID the way the reference PDS words its refusal.
func parseCollection(s string) (syntax.NSID, error) {
	n, err := syntax.ParseNSID(s)
	if err != nil {
		return "", errInvalidRequest("Invalid NSID (got %q)", s)
	}
	return n, nil
}

func parseRKey(s string) (syntax.RecordKey, error) {
	k, err := syntax.ParseRecordKey(s)
	if err != nil {
		return "", errInvalidRequest("Invalid record key (got %q)", s)
	}
	return k, nil
}

// encodeRecordJSON parses a record from JSON into the atproto data model, checks its $type
// against the collection (setting it when absent, as the reference PDS does), and encodes it.
func encodeRecordJSON(collection syntax.NSID, raw json.RawMessage) (*encodedRecord, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return nil, errInvalidRequest("Expected object value type (got %s) at $.record", truncate(string(raw), 40))
	}
	if len(raw) > atdata.MAX_JSON_RECORD_SIZE {
		return nil, errNamed(413, xrpc.PayloadTooLarge, "request entity too large")
	}
	val, err := atdata.UnmarshalJSON(raw)
	if err != nil {
		return nil, errInvalidRequest("Invalid record: %s", cleanErr(err))
	}
	return encodeRecord(collection, val)
}

// encodeRecordValue encodes a record given as Go values (plain JSON-like values or atdata
// types): it goes through JSON so that the same data-model checks apply as for XRPC input.
func encodeRecordValue(collection syntax.NSID, val map[string]any) (*encodedRecord, error) {
	raw, err := json.Marshal(val)
	if err != nil {
		return nil, errInvalidRequest("Invalid record: %s", cleanErr(err))
	}
	return encodeRecordJSON(collection, raw)
}

// encodeRecord checks the $type of a parsed record (atdata.UnmarshalJSON output) and encodes it.
func encodeRecord(collection syntax.NSID, val map[string]any) (*encodedRecord, error) {
	if val == nil {
		return nil, errInvalidRequest("Expected object value type at $.record")
	}
	t, ok := val["$type"]
	if !ok {
		val["$type"] = collection.String()
	} else if ts, _ := t.(string); ts != collection.String() {
		return nil, errInvalidRequest("Invalid $type: expected %s, got %v", collection, t)
	}
	b, err := atdata.MarshalCBOR(val)
	if err != nil {
		return nil, errInvalidRequest("Invalid record: %s", cleanErr(err))
	}
	if len(b) > MaxRecordBytes {
		return nil, errNamed(413, xrpc.PayloadTooLarge, "record is %d bytes, more than %d", len(b), MaxRecordBytes)
	}
	c, err := cidBuilder.Sum(b)
	if err != nil {
		return nil, err
	}
	return &encodedRecord{cid: c, bytes: b, value: val}, nil
}

// recordJSON renders stored record bytes as JSON in the atproto data model.
func recordJSON(b []byte) (json.RawMessage, error) {
	val, err := atdata.UnmarshalCBOR(b)
	if err != nil {
		return nil, fmt.Errorf("stored record: %w", err)
	}
	return json.Marshal(val)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func cleanErr(err error) string {
	return strings.TrimSpace(err.Error())
}
