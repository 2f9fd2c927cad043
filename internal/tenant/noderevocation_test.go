package tenant

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRevokedNodesRefuse(t *testing.T) {
	now := time.Date(2026, 12, 2, 16, 0, 0, 0, time.UTC)
	set := RevokedNodes{Nodes: []RevokedNode{{Name: "node-aa", RevokedAt: now}}}
	for _, tc := range []struct {
		name   string
		id     NodeIdentity
		refuse bool
	}{
		{"the revoked node", NodeIdentity{User: "system:node:node-aa", Groups: []string{"system:nodes", "system:authenticated"}}, true},
		{"its name without system:nodes", NodeIdentity{User: "system:node:node-aa"}, true},
		{"another node", NodeIdentity{User: "system:node:node-bb", Groups: []string{"system:nodes"}}, false},
		{"a name that only starts like it", NodeIdentity{User: "system:node:node-aaa", Groups: []string{"system:nodes"}}, false},
		{"a member named like the node", NodeIdentity{User: "node-aa"}, false},
		{"a member in system:nodes", NodeIdentity{User: "did:plc:x", Groups: []string{"system:nodes"}}, false},
		{"a service account", NodeIdentity{User: "system:serviceaccount:default:node-aa"}, false},
		{"an empty node name", NodeIdentity{User: "system:node:"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refuse, why := set.Refuse(tc.id)
			if refuse != tc.refuse {
				t.Fatalf("Refuse(%+v) = %v (%q), want %v", tc.id, refuse, why, tc.refuse)
			}
			if refuse && !strings.Contains(why, "node-aa was released") {
				t.Errorf("reason %q does not name the node", why)
			}
		})
	}
	if refuse, _ := (RevokedNodes{}).Refuse(NodeIdentity{User: "system:node:node-aa"}); refuse {
		t.Error("an empty set refuses")
	}
}

func TestRevokedNodesWith(t *testing.T) {
	now := time.Date(2026, 12, 2, 16, 0, 0, 0, time.UTC)
	old := RevokedNode{Name: "node-old", RevokedAt: now.Add(-RevokedNodeKeep - time.Second)}
	recent := RevokedNode{Name: "node-recent", RevokedAt: now.Add(-RevokedNodeKeep + time.Second)}
	for _, tc := range []struct {
		name    string
		in      []RevokedNode
		add     string
		want    []string
		changed bool
	}{
		{"first name", nil, "node-a", []string{"node-a"}, true},
		{"again: unchanged, first date kept", []RevokedNode{recent}, "node-recent", []string{"node-recent"}, false},
		{"a name past its keep is forgotten", []RevokedNode{old, recent}, "node-a", []string{"node-recent", "node-a"}, true},
		{"forgetting alone is a change", []RevokedNode{old}, "", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, changed := RevokedNodes{Nodes: tc.in}.With(tc.add, now)
			var got []string
			for _, n := range out.Nodes {
				got = append(got, n.Name)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") || changed != tc.changed {
				t.Fatalf("With(%q) = %v changed %v, want %v changed %v", tc.add, got, changed, tc.want, tc.changed)
			}
			for _, n := range out.Nodes {
				if n.Name == "node-recent" && !n.RevokedAt.Equal(recent.RevokedAt) {
					t.Errorf("node-recent revoked at %s, want %s kept", n.RevokedAt, recent.RevokedAt)
				}
			}
		})
	}
}

// The file the apiserver and the gate read: a write is seen by the next question, an
// unreadable file refuses every node until it is readable again.
func TestRevokedNodesFileFollowsWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "revoked-nodes.json")
	f := NewRevokedNodesFile(path)
	if f.Revoked("node-a") {
		t.Fatal("revoked with no file")
	}
	set, _ := RevokedNodes{}.With("node-a", time.Now())
	if err := saveRevokedNodes(path, set); err != nil {
		t.Fatal(err)
	}
	if !f.Revoked("node-a") || f.Revoked("node-b") {
		t.Fatal("the write is not seen at once")
	}
	set, _ = set.With("node-b", time.Now())
	if err := saveRevokedNodes(path, set); err != nil {
		t.Fatal(err)
	}
	if !f.Revoked("node-a") || !f.Revoked("node-b") {
		t.Fatal("the second write is not seen at once")
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !f.Revoked("node-c") {
		t.Fatal("an unreadable file lets a node in")
	}
	if refuse, _ := f.Refuse(NodeIdentity{User: "did:plc:x"}); refuse {
		t.Fatal("an unreadable file refuses a member")
	}
	if err := saveRevokedNodes(path, set); err != nil {
		t.Fatal(err)
	}
	if f.Revoked("node-c") || !f.Revoked("node-b") {
		t.Fatal("the file readable again is not followed")
	}
}

// RevokeNode writes the name where the apiserver and the gate read it, keeps it across a new
// manager, and no bundle is minted for the name again.
func TestRevokeNode(t *testing.T) {
	root := t.TempDir()
	k := Key{Namespace: "acct-x", Name: "web"}
	m, err := NewManager(Config{Root: root, Binary: "/bin/false", Advertise: net.IPv4(10, 77, 0, 1), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.RevokeNode(k, "node-a"); err != nil {
		t.Fatalf("a cluster with no directory: %v", err)
	}
	if _, err := os.Stat(m.Layout(k).Dir); !os.IsNotExist(err) {
		t.Fatalf("RevokeNode made the directory of a cluster that has none: %v", err)
	}
	if _, err := EnsurePKI(m.Layout(k).PKI(), []net.IP{net.IPv4(127, 0, 0, 1)}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := MintNodeBundle(root, k, "node-a", "https://10.77.0.1:1", 0); err != nil {
		t.Fatal(err)
	}
	if err := m.RevokeNode(k, "node-a"); err != nil {
		t.Fatal(err)
	}
	if err := m.RevokeNode(k, "node-a"); err != nil {
		t.Fatal(err)
	}
	set, err := LoadRevokedNodes(m.Layout(k).RevokedNodes())
	if err != nil || len(set.Nodes) != 1 || set.Nodes[0].Name != "node-a" {
		t.Fatalf("revoked nodes %+v %v", set, err)
	}
	if _, err := MintNodeBundle(root, k, "node-a", "https://10.77.0.1:1", 0); !errors.Is(err, ErrNodeRevoked) {
		t.Fatalf("a bundle for the released name: %v, want ErrNodeRevoked", err)
	}
	if _, err := MintNodeBundle(root, k, "node-b", "https://10.77.0.1:1", 0); err != nil {
		t.Fatalf("another name: %v", err)
	}
	spec := BuildSpec(m.Layout(k), &PKI{Dir: m.Layout(k).PKI()}, 1, net.IPv4(10, 77, 0, 1), Revocations{}, "", time.Now())
	if spec.RevokedNodesFile != m.Layout(k).RevokedNodes() {
		t.Fatalf("the child reads %q, the manager writes %q", spec.RevokedNodesFile, m.Layout(k).RevokedNodes())
	}
}
