package node

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// The kubelet keeps a cgroup per pod under its "kubepods" cgroup, and with the CPU manager's
// default policy (none) it writes every CPU it sees (the host's: it reads them from sysfs)
// into kubepods' cpuset.cpus. A contained node on a cgroup v1 host is bound to a cpuset of
// its contract's CPUs (cgroups.go), and the kernel refuses a child cpuset that is not a
// subset of its parent's (EACCES): the kubelet could not start. So a node bound to some of
// the host's CPUs runs the static policy with the others as reservedSystemCPUs, strictly
// (strict-cpu-reservation: without it the reserved CPUs stay in the pods' shared pool, and
// runc's write of them into a container's cpuset is refused the same way): the kubelet
// then hands its pods only the node's CPUs (the shared pool, and exclusive CPUs to
// Guaranteed pods asking for whole CPUs, as on a machine of that size), leaves kubepods'
// cpuset to inherit the node's, and counts the reserved CPUs out of allocatable as
// systemReserved did. A node bound to every CPU (or with no cpuset) keeps the none policy.

// kubeletCPUManager is the kubelet config's CPU manager stanza for a node whose cpuset is
// nodeCPUs (the kernel's list format; "" when the node is not bound to CPUs) on a host whose
// online CPUs are online.
func kubeletCPUManager(online []int, nodeCPUs string) string {
	bound, err := parseCPUList(nodeCPUs)
	if err != nil || len(bound) == 0 {
		return ""
	}
	var reserved []int
	for _, c := range online {
		if !slices.Contains(bound, c) {
			reserved = append(reserved, c)
		}
	}
	if len(reserved) == 0 {
		return ""
	}
	return fmt.Sprintf("cpuManagerPolicy: static\ncpuManagerPolicyOptions: {strict-cpu-reservation: \"true\"}\nreservedSystemCPUs: %q\n", formatCPUList(reserved))
}

// onlineCPUs are the host's online CPUs, as the kubelet counts them; nil when unreadable
// (the node then keeps the none policy).
func onlineCPUs() []int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return nil
	}
	cpus, _ := parseCPUList(string(b))
	return cpus
}

// cpuManagerState is the static policy's checkpoint in the kubelet's root dir.
const cpuManagerState = "cpu_manager_state"

// writeKubeletConfig writes the kubelet's config; when it changed since the last start of
// this node (a restarted agent got other CPUs), the CPU manager's checkpoint goes with the
// old one: the kubelet refuses to start on a checkpoint of another policy or CPU set.
func writeKubeletConfig(ns nodeState, config string) error {
	path := ns.work("kubelet", "config.yaml")
	if old, err := os.ReadFile(path); err == nil && !bytes.Equal(old, []byte(config)) {
		if err := os.Remove(filepath.Join(ns.work("kubelet"), cpuManagerState)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return os.WriteFile(path, []byte(config), 0o600)
}
