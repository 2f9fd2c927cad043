package infra

import (
	"fmt"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// ATURI is the at-uri of one record: at://<did>/<collection>/<rkey>. Its parts are indigo's
// syntax types, so a value from ParseATURI carries its checks with it.
type ATURI struct {
	DID        syntax.DID
	Collection syntax.NSID
	Rkey       syntax.RecordKey
}

func (u ATURI) String() string {
	return "at://" + u.DID.String() + "/" + u.Collection.String() + "/" + u.Rkey.String()
}

// ParseATURI parses the at-uri of one record: a DID authority, a collection NSID and a record
// key. It is the tree's one parser of at-uris: syntax.ParseATURI checks the syntax, which also
// admits a handle authority or a shorter path; a record's uri must name its repo by DID (a
// handle can move) and name the record.
func ParseATURI(s string) (ATURI, error) {
	const want = "want at://<did>/<collection>/<rkey>"
	u, err := syntax.ParseATURI(s)
	if err != nil {
		return ATURI{}, fmt.Errorf("at-uri %q: %v; %s", s, err, want)
	}
	did, err := u.Authority().AsDID()
	if err != nil {
		return ATURI{}, fmt.Errorf("at-uri %q: authority %q is not a DID; a record's at-uri names its repo by DID", s, u.Authority())
	}
	coll, rkey := u.Collection(), u.RecordKey()
	if coll == "" || rkey == "" {
		return ATURI{}, fmt.Errorf("at-uri %q names no record; %s", s, want)
	}
	return ATURI{DID: did, Collection: coll, Rkey: rkey}, nil
}

// RecordURI is the at-uri of kind's record at rkey in the repo of did: both come from this
// side (a repo's DID as its PDS reported it, a key this tree made), not from a peer.
func RecordURI(did string, kind Kind, rkey string) string {
	return ATURI{DID: syntax.DID(did), Collection: syntax.NSID(kind.Collection()), Rkey: syntax.RecordKey(rkey)}.String()
}

// CheckFollow checks the uri a following object names: its DID must be the repo's and its
// collection the kind's NSID.
func CheckFollow(uri, repoDID string, kind Kind) (ATURI, error) {
	u, err := ParseATURI(uri)
	if err != nil {
		return ATURI{}, err
	}
	if u.DID.String() != repoDID {
		return ATURI{}, fmt.Errorf("at-uri %q: DID %s is not the repo's (%s)", uri, u.DID, repoDID)
	}
	if u.Collection.String() != kind.Collection() {
		return ATURI{}, fmt.Errorf("at-uri %q: collection %s is not %s", uri, u.Collection, kind.Collection())
	}
	return u, nil
}
