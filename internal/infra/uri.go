package infra

import (
	"fmt"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// ATURI is the at-uri of one record: at://<did>/<collection>/<rkey>.
type ATURI struct {
	DID        string
	Collection string
	Rkey       string
}

func (u ATURI) String() string { return "at://" + u.DID + "/" + u.Collection + "/" + u.Rkey }

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
	return ATURI{DID: did.String(), Collection: coll.String(), Rkey: rkey.String()}, nil
}

// RecordURI is the at-uri of kind's record at rkey in the repo of did.
func RecordURI(did string, kind Kind, rkey string) string {
	return ATURI{DID: did, Collection: kind.Collection(), Rkey: rkey}.String()
}

// CheckFollow checks the uri a following object names: its DID must be the repo's and its
// collection the kind's NSID.
func CheckFollow(uri, repoDID string, kind Kind) (ATURI, error) {
	u, err := ParseATURI(uri)
	if err != nil {
		return ATURI{}, err
	}
	if u.DID != repoDID {
		return ATURI{}, fmt.Errorf("at-uri %q: DID %s is not the repo's (%s)", uri, u.DID, repoDID)
	}
	if u.Collection != kind.Collection() {
		return ATURI{}, fmt.Errorf("at-uri %q: collection %s is not %s", uri, u.Collection, kind.Collection())
	}
	return u, nil
}
