// Package firehose encodes and decodes com.atproto.sync.subscribeRepos frames: a DAG-CBOR
// header ({op, t}) followed by a DAG-CBOR body. The PDS writes frames with it and the client's
// consumer reads them, so both ends share one definition of the wire format.
package firehose

import (
	"bytes"
	"fmt"
	"io"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	cbornode "github.com/ipfs/go-ipld-cbor"
	cbg "github.com/whyrusleeping/cbor-gen"
)

// Message types of subscribeRepos.
const (
	TypeCommit   = "#commit"
	TypeIdentity = "#identity"
	TypeAccount  = "#account"
	TypeSync     = "#sync"
	TypeInfo     = "#info"
)

// MaxFrameSize bounds a frame a consumer accepts.
const MaxFrameSize = 5 << 20

// Event is one decoded frame. Exactly one of the typed fields is set for a message frame;
// Error and ErrorMessage are set for an error frame (op -1).
type Event struct {
	Seq      int64
	Type     string
	Commit   *comatproto.SyncSubscribeRepos_Commit
	Identity *comatproto.SyncSubscribeRepos_Identity
	Account  *comatproto.SyncSubscribeRepos_Account
	Sync     *comatproto.SyncSubscribeRepos_Sync
	Info     *comatproto.SyncSubscribeRepos_Info

	Error        string
	ErrorMessage string
}

// DID is the account the event is about ("" for info and error frames).
func (e *Event) DID() string {
	switch {
	case e.Commit != nil:
		return e.Commit.Repo
	case e.Identity != nil:
		return e.Identity.Did
	case e.Account != nil:
		return e.Account.Did
	case e.Sync != nil:
		return e.Sync.Did
	}
	return ""
}

func writeText(w *cbg.CborWriter, s string) error {
	if err := w.WriteMajorTypeHeader(cbg.MajTextString, uint64(len(s))); err != nil {
		return err
	}
	_, err := w.WriteString(s)
	return err
}

func writeHeader(w *cbg.CborWriter, op int64, t string) error {
	n := uint64(1)
	if t != "" {
		n = 2
	}
	if err := w.WriteMajorTypeHeader(cbg.MajMap, n); err != nil {
		return err
	}
	// DAG-CBOR map keys sort by length first: "t" before "op".
	if t != "" {
		if err := writeText(w, "t"); err != nil {
			return err
		}
		if err := writeText(w, t); err != nil {
			return err
		}
	}
	if err := writeText(w, "op"); err != nil {
		return err
	}
	if op >= 0 {
		return w.WriteMajorTypeHeader(cbg.MajUnsignedInt, uint64(op))
	}
	return w.WriteMajorTypeHeader(cbg.MajNegativeInt, uint64(-op-1))
}

type cborMarshaler interface{ MarshalCBOR(io.Writer) error }

// Encode writes a message frame of type t with body v.
func Encode(t string, v cborMarshaler) ([]byte, error) {
	var buf bytes.Buffer
	if err := writeHeader(cbg.NewCborWriter(&buf), 1, t); err != nil {
		return nil, err
	}
	if err := v.MarshalCBOR(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// EncodeError writes an error frame (op -1) with the given error name and message.
func EncodeError(name, message string) []byte {
	var buf bytes.Buffer
	_ = writeHeader(cbg.NewCborWriter(&buf), -1, "")
	body, _ := cbornode.DumpObject(map[string]any{"error": name, "message": message})
	buf.Write(body)
	return buf.Bytes()
}

// Decode reads one frame.
func Decode(frame []byte) (*Event, error) {
	if len(frame) > MaxFrameSize {
		return nil, fmt.Errorf("firehose: frame of %d bytes is too large", len(frame))
	}
	r := bytes.NewReader(frame)
	var hdrRaw cbg.Deferred
	if err := hdrRaw.UnmarshalCBOR(r); err != nil {
		return nil, fmt.Errorf("firehose: header: %w", err)
	}
	var hdr struct {
		Op int64  `refmt:"op"`
		T  string `refmt:"t"`
	}
	var hm map[string]any
	if err := cbornode.DecodeInto(hdrRaw.Raw, &hm); err != nil {
		return nil, fmt.Errorf("firehose: header: %w", err)
	}
	switch op := hm["op"].(type) {
	case int:
		hdr.Op = int64(op)
	case int64:
		hdr.Op = op
	case uint64:
		hdr.Op = int64(op)
	default:
		return nil, fmt.Errorf("firehose: header without op")
	}
	hdr.T, _ = hm["t"].(string)
	rest := frame[len(frame)-r.Len():]
	ev := &Event{Type: hdr.T}
	if hdr.Op == -1 {
		var body map[string]any
		if err := cbornode.DecodeInto(rest, &body); err != nil {
			return nil, fmt.Errorf("firehose: error body: %w", err)
		}
		ev.Error, _ = body["error"].(string)
		ev.ErrorMessage, _ = body["message"].(string)
		return ev, nil
	}
	if hdr.Op != 1 {
		return nil, fmt.Errorf("firehose: unknown op %d", hdr.Op)
	}
	br := bytes.NewReader(rest)
	var err error
	switch hdr.T {
	case TypeCommit:
		ev.Commit = new(comatproto.SyncSubscribeRepos_Commit)
		err = ev.Commit.UnmarshalCBOR(br)
		ev.Seq = ev.Commit.Seq
	case TypeIdentity:
		ev.Identity = new(comatproto.SyncSubscribeRepos_Identity)
		err = ev.Identity.UnmarshalCBOR(br)
		ev.Seq = ev.Identity.Seq
	case TypeAccount:
		ev.Account = new(comatproto.SyncSubscribeRepos_Account)
		err = ev.Account.UnmarshalCBOR(br)
		ev.Seq = ev.Account.Seq
	case TypeSync:
		ev.Sync = new(comatproto.SyncSubscribeRepos_Sync)
		err = ev.Sync.UnmarshalCBOR(br)
		ev.Seq = ev.Sync.Seq
	case TypeInfo:
		ev.Info = new(comatproto.SyncSubscribeRepos_Info)
		err = ev.Info.UnmarshalCBOR(br)
	default:
		// Unknown message types are skipped by consumers, as the spec asks.
		return ev, nil
	}
	if err != nil {
		return nil, fmt.Errorf("firehose: %s body: %w", hdr.T, err)
	}
	return ev, nil
}
