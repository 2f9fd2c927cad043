package nodehost

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"unicode"
)

// maxObjectName is the longest object name (a DNS-1123 subdomain).
const maxObjectName = 253

// NewNodeName is a fresh node name: "node-" and 10 random hex digits. Node names only need
// to be unique within one tenant cluster; the caller also checks them against the claims it
// knows.
func NewNodeName() (string, error) {
	b := make([]byte, 5)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "node-" + hex.EncodeToString(b), nil
}

// ClaimName is the NodeClaim of a node in the Cluster's namespace: "<cluster>-<node>", the
// cluster part shortened (and stripped of a trailing '-' or '.') so that the whole stays a
// valid object name.
func ClaimName(cluster, node string) string {
	room := maxObjectName - len(node) - 1
	if room < 1 {
		return node
	}
	if len(cluster) > room {
		cluster = strings.TrimRight(cluster[:room], "-.")
	}
	if cluster == "" {
		return node
	}
	return cluster + "-" + node
}

// ConditionReason turns a decision's reason ("intent and no node") into a condition reason
// ("IntentAndNoNode"): words capitalised, anything but letters and digits dropped, a
// leading digit prefixed, "Unknown" when nothing is left.
func ConditionReason(reason string) string {
	var b strings.Builder
	up := true
	for _, r := range reason {
		switch {
		case r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)):
			if up {
				r = unicode.ToUpper(r)
			}
			b.WriteRune(r)
			up = false
		default:
			up = true
		}
	}
	s := b.String()
	if s == "" {
		return "Unknown"
	}
	if s[0] >= '0' && s[0] <= '9' {
		s = "N" + s
	}
	return s
}
