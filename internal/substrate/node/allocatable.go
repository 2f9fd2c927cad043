package node

import (
	"fmt"
	"strconv"
	"strings"

	"socialweb.computer/internal/hostcap"
)

// A node advertises its contract, not its host: the kubelet reads the host's CPUs and memory
// as the node's capacity, and everything beyond the contract's cpus and mem is reserved for
// the system (systemReserved), so the node's allocatable, what the scheduler places pods
// against, is the contract. The node's cgroup enforces the same figures (cgroups.go). Two
// nodes on one host then claim their contracts, not the whole host twice.

// evictionHardMemoryBytes is the kubelet config's evictionHard memory.available (1Mi):
// the kubelet subtracts it from allocatable too.
const evictionHardMemoryBytes = 1 << 20

// hostCapacity is what the kubelet will read as the node's capacity: the host's CPUs and
// MemTotal.
type hostCapacity = hostcap.Capacity

func readHostCapacity() (hostCapacity, error) { return hostcap.Read() }

// systemReserved is the kubelet's systemReserved for a node of cpus and memMiB on a host of
// capacity h: the host's CPUs and memory beyond them. A figure the contract leaves unset
// (0), or one larger than the host, reserves nothing of that resource: the node never
// advertises more than its host has.
func systemReserved(h hostCapacity, cpus, memMiB int) (milliCPU, memBytes int64) {
	if c := int64(cpus) * 1000; cpus > 0 && c < h.MilliCPU {
		milliCPU = h.MilliCPU - c
	}
	if m := int64(memMiB)<<20 + evictionHardMemoryBytes; memMiB > 0 && m < h.MemBytes {
		memBytes = h.MemBytes - m
	}
	return milliCPU, memBytes
}

// systemReservedConfig is the kubelet config's systemReserved stanza for ns ("" when
// nothing is reserved).
func systemReservedConfig(ns nodeState, h hostCapacity) string {
	cpu, mem := systemReserved(h, ns.CPUs, ns.MemMiB)
	var parts []string
	if cpu > 0 {
		parts = append(parts, fmt.Sprintf("cpu: %dm", cpu))
	}
	if mem > 0 {
		parts = append(parts, fmt.Sprintf("memory: %q", strconv.FormatInt(mem, 10)))
	}
	if len(parts) == 0 {
		return ""
	}
	return "systemReserved: {" + strings.Join(parts, ", ") + "}\n"
}
