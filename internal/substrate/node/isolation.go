package node

import "socialweb.computer/internal/substrate"

// namespaceLayers are what the namespace flavour applies to every node today: containerd,
// the kubelet and the pods run in the node's own network namespace (a veth pair to the
// host), on the host's kernel, in the host's mount and PID namespaces, as root. The node's
// cgroups group its processes but set no limit, so cgroup-limits is not listed.
//
// Extend the list only with a layer every node gets and a test attacks (watch it fail
// without the layer first): the bidder publishes it in its offering, and requesters choose
// bidders by it.
var namespaceLayers = []string{
	substrate.LayerNetworkNamespace, // test/e2e node rows: each node in its own netns, gone after release
}

// Isolation implements substrate.Substrate: the vm flavour is the vm substrate's machine per
// node (with its accelerator); the namespace flavour is the layers above.
func (s *Substrate) Isolation() substrate.Isolation {
	if s.cfg.Flavour == FlavourVM && s.vm != nil {
		return s.vm.Isolation()
	}
	return substrate.Isolation{Boundary: substrate.BoundaryNamespace, Layers: append([]string(nil), namespaceLayers...)}
}
