// Package plc is a did:plc directory: it accepts signed operations over plc.directory's HTTP
// API (POST /:did), checks each operation's signature against the rotation keys in force and
// its prev link against the head of the DID's log, and serves the resulting DID documents
// (GET /:did, /:did/data, /:did/log, /:did/log/last, /:did/log/audit).
//
// The one decision that shapes it: the log of a DID is strictly linear. plc.directory lets a
// higher-priority rotation key fork the log within 72 hours (nullification); this directory
// refuses any operation whose prev is not the current head. Every DID it serves was created by
// a PDS in the same deployment, so recovery forks are not needed, and a linear log keeps the
// verification rule short enough to read.
package plc

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
)

// Operation types.
const (
	TypeOperation = "plc_operation"
	TypeTombstone = "plc_tombstone"
)

// Service is one entry of an operation's services map.
type Service struct {
	Type     string `json:"type"`
	Endpoint string `json:"endpoint"`
}

// Op is a did:plc operation as it travels in JSON. Prev is nil only in a genesis operation.
type Op struct {
	Type                string             `json:"type"`
	RotationKeys        []string           `json:"rotationKeys,omitempty"`
	VerificationMethods map[string]string  `json:"verificationMethods,omitempty"`
	AlsoKnownAs         []string           `json:"alsoKnownAs,omitempty"`
	Services            map[string]Service `json:"services,omitempty"`
	Prev                *string            `json:"prev"`
	Sig                 string             `json:"sig,omitempty"`
}

// MarshalJSON writes the fields a plc_operation always carries, even when empty.
func (o Op) MarshalJSON() ([]byte, error) {
	return json.Marshal(o.data(true))
}

// Error is a refusal of an operation or a lookup; Status is the HTTP status the directory answers.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return e.Message }

func badOp(format string, args ...any) error {
	return &Error{Status: 400, Message: fmt.Sprintf(format, args...)}
}

// ErrNotFound is returned for a DID the directory has never seen.
var ErrNotFound = errors.New("DID not registered")

// data is the operation as a generic map, the shape both DAG-CBOR and JSON encodings use.
func (o *Op) data(withSig bool) map[string]any {
	m := map[string]any{"type": o.Type}
	if o.Prev == nil {
		m["prev"] = nil
	} else {
		m["prev"] = *o.Prev
	}
	if o.Type == TypeOperation {
		rk := make([]any, len(o.RotationKeys))
		for i, k := range o.RotationKeys {
			rk[i] = k
		}
		vm := map[string]any{}
		for k, v := range o.VerificationMethods {
			vm[k] = v
		}
		aka := make([]any, len(o.AlsoKnownAs))
		for i, a := range o.AlsoKnownAs {
			aka[i] = a
		}
		svc := map[string]any{}
		for k, s := range o.Services {
			svc[k] = map[string]any{"type": s.Type, "endpoint": s.Endpoint}
		}
		m["rotationKeys"] = rk
		m["verificationMethods"] = vm
		m["alsoKnownAs"] = aka
		m["services"] = svc
	}
	if withSig && o.Sig != "" {
		m["sig"] = o.Sig
	}
	return m
}

// UnsignedBytes is the DAG-CBOR encoding of the operation without its signature.
func (o *Op) UnsignedBytes() ([]byte, error) { return atdata.MarshalCBOR(o.data(false)) }

// SignedBytes is the DAG-CBOR encoding of the whole operation.
func (o *Op) SignedBytes() ([]byte, error) { return atdata.MarshalCBOR(o.data(true)) }

// CID is the content address of the signed operation: the value a following operation's prev holds.
func (o *Op) CID() (cid.Cid, error) {
	b, err := o.SignedBytes()
	if err != nil {
		return cid.Undef, err
	}
	return cid.V1Builder{Codec: cid.DagCBOR, MhType: multihash.SHA2_256}.Sum(b)
}

// Sign signs the operation with a rotation key.
func (o *Op) Sign(key atcrypto.PrivateKey) error {
	o.Sig = ""
	b, err := o.UnsignedBytes()
	if err != nil {
		return err
	}
	sig, err := key.HashAndSign(b)
	if err != nil {
		return err
	}
	o.Sig = base64.RawURLEncoding.EncodeToString(sig)
	return nil
}

// DID is the did:plc identifier a signed genesis operation creates.
func (o *Op) DID() (string, error) {
	b, err := o.SignedBytes()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	enc := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:]))
	return "did:plc:" + enc[:24], nil
}

// checkShape validates the fields of an operation, not its place in a log.
func (o *Op) checkShape() error {
	switch o.Type {
	case TypeOperation:
		if len(o.RotationKeys) == 0 || len(o.RotationKeys) > 5 {
			return badOp("Invalid operation: rotationKeys must hold 1 to 5 keys")
		}
		for _, k := range o.RotationKeys {
			if _, err := atcrypto.ParsePublicDIDKey(k); err != nil {
				return badOp("Invalid operation: rotation key %q: %v", k, err)
			}
		}
		if len(o.VerificationMethods) > 10 {
			return badOp("Invalid operation: too many verification methods")
		}
		for id, k := range o.VerificationMethods {
			if _, err := atcrypto.ParsePublicDIDKey(k); err != nil {
				return badOp("Invalid operation: verification method %q: %v", id, err)
			}
		}
		if len(o.AlsoKnownAs) > 10 {
			return badOp("Invalid operation: too many alsoKnownAs entries")
		}
		for id, s := range o.Services {
			if s.Type == "" || s.Endpoint == "" {
				return badOp("Invalid operation: service %q needs type and endpoint", id)
			}
		}
	case TypeTombstone:
		if o.Prev == nil {
			return badOp("Invalid operation: a tombstone needs prev")
		}
		if len(o.RotationKeys) != 0 || len(o.VerificationMethods) != 0 || len(o.AlsoKnownAs) != 0 || len(o.Services) != 0 {
			return badOp("Invalid operation: a tombstone carries only type, prev and sig")
		}
	default:
		return badOp("Invalid operation type: %q", o.Type)
	}
	if o.Sig == "" {
		return badOp("Invalid operation: missing signature")
	}
	b, err := o.SignedBytes()
	if err != nil {
		return badOp("Invalid operation: %v", err)
	}
	if len(b) > 7500 {
		return badOp("Operation too large")
	}
	return nil
}

// verifySig checks the signature against any of the given rotation keys.
func (o *Op) verifySig(rotationKeys []string) error {
	sig, err := base64.RawURLEncoding.DecodeString(o.Sig)
	if err != nil {
		return badOp("Invalid signature encoding")
	}
	b, err := o.UnsignedBytes()
	if err != nil {
		return badOp("Invalid operation: %v", err)
	}
	for _, k := range rotationKeys {
		pub, err := atcrypto.ParsePublicDIDKey(k)
		if err != nil {
			continue
		}
		if pub.HashAndVerify(b, sig) == nil {
			return nil
		}
	}
	return badOp("Invalid signature on op")
}

// ParseOp decodes one operation from JSON, refusing unknown fields.
func ParseOp(b []byte) (*Op, error) {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var o Op
	if err := dec.Decode(&o); err != nil {
		return nil, badOp("Invalid operation: %v", err)
	}
	if dec.More() {
		return nil, badOp("Invalid operation: trailing data")
	}
	return &o, nil
}

// Verify checks that op may follow log (the DID's operations so far, oldest first) for did.
// An empty log means op must be the DID's genesis operation.
func Verify(did string, log []*Op, op *Op) error {
	if err := op.checkShape(); err != nil {
		return err
	}
	if len(log) == 0 {
		if op.Type != TypeOperation || op.Prev != nil {
			return badOp("Invalid genesis operation: must be a plc_operation with prev null")
		}
		got, err := op.DID()
		if err != nil {
			return badOp("Invalid operation: %v", err)
		}
		if got != did {
			return badOp("Hash of genesis operation does not match DID identifier: %s", got)
		}
		return op.verifySig(op.RotationKeys)
	}
	last := log[len(log)-1]
	if last.Type == TypeTombstone {
		return badOp("DID is tombstoned: %s", did)
	}
	if op.Prev == nil {
		return badOp("DID already exists: %s", did)
	}
	head, err := last.CID()
	if err != nil {
		return err
	}
	if *op.Prev != head.String() {
		return badOp("Operations not correctly ordered: prev must be %s", head.String())
	}
	return op.verifySig(last.RotationKeys)
}

// Genesis builds and signs the genesis operation of a new DID and returns the DID with it.
func Genesis(rotation atcrypto.PrivateKey, rotationKeys []string, signingKey string, handle, pdsEndpoint string) (string, *Op, error) {
	op := &Op{
		Type:                TypeOperation,
		RotationKeys:        rotationKeys,
		VerificationMethods: map[string]string{"atproto": signingKey},
		AlsoKnownAs:         []string{"at://" + handle},
		Services:            map[string]Service{"atproto_pds": {Type: "AtprotoPersonalDataServer", Endpoint: pdsEndpoint}},
	}
	if err := op.Sign(rotation); err != nil {
		return "", nil, err
	}
	did, err := op.DID()
	if err != nil {
		return "", nil, err
	}
	return did, op, nil
}

// Next builds and signs an operation that follows prev with the given content.
func Next(rotation atcrypto.PrivateKey, prev *Op, content Op) (*Op, error) {
	c, err := prev.CID()
	if err != nil {
		return nil, err
	}
	s := c.String()
	content.Prev = &s
	if content.Type == "" {
		content.Type = TypeOperation
	}
	if err := content.Sign(rotation); err != nil {
		return nil, err
	}
	return &content, nil
}
