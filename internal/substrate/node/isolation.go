package node

import (
	"runtime"

	"socialweb.computer/internal/substrate"
)

// namespaceLayers are what the namespace flavour applies to every node: containerd, the
// kubelet and the pods run in the node's own network namespace (a veth pair to the host, the
// host refusing connections from it), in mount and PID namespaces of their own under a root
// that holds only read-only binaries and the node's own dirs, every container under
// seccomp RuntimeDefault, and the whole node in a cgroup with the contract's CPU, memory and
// pids limits. All on the host's kernel, as root: the node itself has no user namespace, so
// a container that escapes a pod in the host's user namespace is root in the node's
// namespaces (docs/security.md). On the node runtime, pods with hostUsers: false run in user
// namespaces of their own (pod-user-namespaces).
//
// Extend the list only with a layer every node gets and a test attacks (watch it fail
// without the layer first): the bidder publishes it in its offering, and requesters choose
// bidders by it.
var namespaceLayers = []string{
	substrate.LayerNetworkNamespace, // TestSecurity_NodeContainment: network from the node and from the pod
	substrate.LayerMountNamespace,   // TestSecurity_NodeContainment: escape to the node's namespaces
	substrate.LayerPIDNamespace,     // TestSecurity_NodeContainment: escape to the node's namespaces
	substrate.LayerSeccomp,          // TestSecurity_NodeContainment: seccomp
	substrate.LayerCgroupLimits,     // TestSecurity_NodeContainment: cgroup limits
}

// Isolation implements substrate.Substrate: the vm flavour is the vm substrate's machine per
// node (with its accelerator); the namespace flavour is the layers above.
func (s *Substrate) Isolation() substrate.Isolation {
	if s.cfg.Flavour == FlavourVM && s.vm != nil {
		return s.vm.Isolation()
	}
	if s.cfg.Uncontained {
		return substrate.Isolation{Boundary: substrate.BoundaryNamespace, Layers: []string{substrate.LayerNetworkNamespace}}
	}
	layers := append([]string(nil), namespaceLayers...)
	if s.runtime.UserNamespaces() {
		// TestNode_UserNamespacePodIsNotHostRoot, TestSecurity_TenantPodsRunInUserNamespaces:
		// the pod's uid 0 is not host root.
		layers = append(layers, substrate.LayerPodUserNamespaces)
	}
	return substrate.Isolation{Boundary: substrate.BoundaryNamespace, Layers: layers}
}

// Arch implements substrate.Architected: a vm node is the vm substrate's machine; a
// namespace node runs on this host.
func (s *Substrate) Arch() string {
	if s.cfg.Flavour == FlavourVM && s.vm != nil {
		return s.vm.Arch()
	}
	return runtime.GOARCH
}
