// Package simulate places pending pods the way the kube-scheduler would, on the nodes a
// tenant cluster has and on hypothetical nodes of the size on offer, to say how many new
// nodes the pods need and which pods no node of that size can ever run (and why).
//
// The one decision that shapes the package: it does not model the scheduler, it runs it.
// Plan builds a scheduler framework from the in-tree plugin registry with a profile that
// enables only the filters that decide where a pod can go, points it at a snapshot of the
// nodes and their pods, and for each pending pod runs PreFilter then Filter, as the
// scheduler does in one scheduling cycle (and as Cluster Autoscaler and Karpenter do when
// they simulate). The verdict and its reason ("Insufficient cpu", "node(s) didn't match
// pod anti-affinity rules") are the scheduler's own. Only this package imports
// k8s.io/kubernetes/pkg/scheduler; package scale stays a pure function of small values.
//
// The filters run, each at PreFilter and Filter:
//
//   - NodeResourcesFit: requests (cpu, memory, ephemeral storage, extended resources) and
//     the pod count against the node's allocatable, less what its pods request.
//   - NodeName: a pod that names its node goes there only.
//   - NodeUnschedulable: a cordoned node takes only pods that tolerate it.
//   - NodeAffinity: nodeSelector and required node affinity against the node's labels.
//   - TaintToleration: NoSchedule and NoExecute taints the pod does not tolerate.
//   - InterPodAffinity: required pod affinity and anti-affinity, the pod's and that of
//     the pods already placed (with their topology keys).
//   - PodTopologySpread: DoNotSchedule constraints (maxSkew over the domains of the
//     snapshot's nodes).
//   - NodePorts: host ports already taken on the node.
//
// Left out: VolumeBinding, VolumeRestrictions, VolumeZone and the CSI volume limits (they
// read PersistentVolumes, claims and storage classes, which Plan is not given; a pod's
// volumes are taken to bind anywhere, and a caller that knows a bound volume's node
// affinity writes it into the pod's required node affinity, as the node host does),
// DynamicResources, and the scoring plugins (Plan
// packs first-fit, it does not pick the node the scheduler would prefer). The informers
// the plugins ask for are never started: InterPodAffinity's namespaceSelector sees only
// the namespaces of the pods given, labelled with their name (kubernetes.io/metadata.name),
// and PodTopologySpread's system default constraints (ScheduleAnyway, never a filter) find
// no services to derive them from.
//
// Placement is first-fit decreasing, as Cluster Autoscaler's and Karpenter's bin packing
// are: pods in a stable order, larger first (by the larger of their shares of a new node's
// cpu and memory, then cpu, memory, namespace/name); each goes on the first existing node
// (by name) that passes, else the first hypothetical node already opened, else a new one.
// A pod nominated (status.nominatedNodeName) to one of the given nodes is placed there
// before the others when it passes: the scheduler tries a pod's nominated node first and
// holds its room, so the plan keeps what it nominated rather than re-packing it.
// Each placed pod joins the snapshot, so later pods see it (two pods with hostname
// anti-affinity to each other get a node each). A new node is tried even when maxNew are
// in use, so that a pod no new node can run says why rather than that room ran out.
//
// The framework counts plugin evaluations in the scheduler's metrics; Plan registers them
// (scheduler metrics.Register, once per process, as an in-process kube-scheduler does) in
// the process's legacy registry. Plan builds its framework for each call (tens of
// microseconds; 50 pods on a few nodes take about 10 ms), and nothing lives between calls.
package simulate
