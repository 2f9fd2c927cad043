package infra

import (
	"fmt"
	"strings"
)

// ATURI is the at-uri of one record: at://<did>/<collection>/<rkey>.
type ATURI struct {
	DID        string
	Collection string
	Rkey       string
}

func (u ATURI) String() string { return "at://" + u.DID + "/" + u.Collection + "/" + u.Rkey }

// ParseATURI parses the at-uri of a record whose authority is a DID.
func ParseATURI(s string) (ATURI, error) {
	rest, ok := strings.CutPrefix(s, "at://")
	if !ok {
		return ATURI{}, fmt.Errorf("at-uri %q: must start with at://", s)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return ATURI{}, fmt.Errorf("at-uri %q: want at://<did>/<collection>/<rkey>", s)
	}
	u := ATURI{DID: parts[0], Collection: parts[1], Rkey: parts[2]}
	if d := strings.SplitN(u.DID, ":", 3); len(d) != 3 || d[0] != "did" || d[1] == "" || d[2] == "" {
		return ATURI{}, fmt.Errorf("at-uri %q: authority %q is not a DID", s, u.DID)
	}
	if u.Collection == "" || strings.Count(u.Collection, ".") < 2 {
		return ATURI{}, fmt.Errorf("at-uri %q: collection %q is not an NSID", s, u.Collection)
	}
	if _, err := ParseRecordKey(u.Rkey); err != nil {
		return ATURI{}, fmt.Errorf("at-uri %q: %w", s, err)
	}
	return u, nil
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
