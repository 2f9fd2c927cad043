package tenant

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"socialweb.computer/internal/atomicfile"
)

// A released node's credentials stop working at once. A client certificate cannot be taken
// back (kube-apiserver checks no revocation list), and a node holds more than the one in its
// join bundle: the kubelet renews its own through the CSR API, and whoever ran the node (its
// bidder, or a tenant inside the guest) may have kept copies of all of them. Every one of
// them names the node (CN=system:node:NAME): names are revoked, not certificates. The
// cluster's revoked node names are kept in its directory (revoked-nodes.json), written by the
// manager when a node's claim is released, read by the tenant apiserver (its authentication
// refuses the identity) and by the gate's tunnel server (a tunnel is refused, an open one
// closed). Names are never reused: a node name is random per claim, and a bundle is not
// minted for a revoked one.

// RevokedNodeKeep is how long a revoked name is kept: past it no certificate naming the node
// can still be valid. The bundle lives NodeBundleTTL and so does every certificate the
// cluster's signer issues (--cluster-signing-duration); a renewal the node requested before
// its release is signed at the latest when its request expires (24 h, the controller-manager's
// cleaner), so two lifetimes after the revocation nothing of it verifies. Kept for a week.
const RevokedNodeKeep = 7 * 24 * time.Hour

// NodeUserPrefix is the user name prefix of a node's identity (the Node authorizer's).
const NodeUserPrefix = "system:node:"

// ErrNodeRevoked: the node name was released in this cluster; no credential for it is minted
// again (a new node takes a new name).
var ErrNodeRevoked = errors.New("the node name was released in this cluster and is revoked")

// RevokedNode is one released node name.
type RevokedNode struct {
	Name      string    `json:"name"`
	RevokedAt time.Time `json:"revokedAt"`
}

// RevokedNodes is a cluster's set of released node names.
type RevokedNodes struct {
	Nodes []RevokedNode `json:"nodes,omitempty"`
}

// Has reports whether node name is revoked.
func (r RevokedNodes) Has(name string) bool {
	return slices.ContainsFunc(r.Nodes, func(n RevokedNode) bool { return n.Name == name })
}

// With is the set with name revoked at now, and the names revoked more than RevokedNodeKeep
// before now forgotten; changed says whether the set differs from r.
func (r RevokedNodes) With(name string, now time.Time) (out RevokedNodes, changed bool) {
	for _, n := range r.Nodes {
		if now.Sub(n.RevokedAt) <= RevokedNodeKeep {
			out.Nodes = append(out.Nodes, n)
		}
	}
	changed = len(out.Nodes) != len(r.Nodes)
	if name != "" && !out.Has(name) {
		out.Nodes = append(out.Nodes, RevokedNode{Name: name, RevokedAt: now.UTC()})
		changed = true
	}
	return out, changed
}

// NodeIdentity is what authentication established about a request's user.
type NodeIdentity struct {
	User   string
	Groups []string
}

// Refuse decides whether an authenticated identity is a revoked node's, and why. Any user
// named system:node:NAME is refused when NAME is revoked, whatever its groups: without
// system:nodes the Node authorizer does not treat it as the node, but RBAC may still bind the
// name, and no credential naming a released node should work.
func (r RevokedNodes) Refuse(id NodeIdentity) (bool, string) {
	name, ok := strings.CutPrefix(id.User, NodeUserPrefix)
	if !ok || name == "" || !r.Has(name) {
		return false, ""
	}
	return true, fmt.Sprintf("node %s was released from this cluster; its credentials are revoked", name)
}

// LoadRevokedNodes reads a cluster's revoked node names from path; none is the empty set.
func LoadRevokedNodes(path string) (RevokedNodes, error) {
	var r RevokedNodes
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

func saveRevokedNodes(path string, r RevokedNodes) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, b, 0o600)
}

// RevokedNodesFile is a cluster's revoked-nodes.json as its readers see it: read again
// whenever the file changed (its inode, size or modification time: it is replaced by a
// rename on every write), checked with a stat on every question, so a name revoked by the
// manager is refused by the next request after the write, with no restart and no window.
// A file that cannot be read refuses every node (fail closed) until it can.
type RevokedNodesFile struct {
	path string

	mu     sync.Mutex
	loaded bool
	stamp  fileStamp
	set    RevokedNodes
	err    error
}

type fileStamp struct {
	ino   uint64
	size  int64
	mtime time.Time
	found bool
}

// NewRevokedNodesFile reads path (absent is the empty set).
func NewRevokedNodesFile(path string) *RevokedNodesFile {
	f := &RevokedNodesFile{path: path}
	f.Current()
	return f
}

// Current is the set now, and the error of its last read (the set is then the last one read).
func (f *RevokedNodesFile) Current() (RevokedNodes, error) {
	st := stampOf(f.path)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.loaded && st == f.stamp && f.err == nil {
		return f.set, nil
	}
	set, err := LoadRevokedNodes(f.path)
	if err == nil {
		f.set = set
	}
	f.stamp, f.err, f.loaded = st, err, true
	return f.set, f.err
}

// Refuse is RevokedNodes.Refuse on the current set; an unreadable file refuses every node.
func (f *RevokedNodesFile) Refuse(id NodeIdentity) (bool, string) {
	set, err := f.Current()
	if err != nil && strings.HasPrefix(id.User, NodeUserPrefix) {
		return true, "the cluster's revoked nodes cannot be read: " + err.Error()
	}
	return set.Refuse(id)
}

// Revoked reports whether node name is revoked (or the set cannot be read).
func (f *RevokedNodesFile) Revoked(name string) bool {
	refuse, _ := f.Refuse(NodeIdentity{User: NodeUserPrefix + name})
	return refuse
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	s := fileStamp{size: fi.Size(), mtime: fi.ModTime(), found: true}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = sys.Ino
	}
	return s
}
