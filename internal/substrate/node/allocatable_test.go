package node

import (
	"strings"
	"testing"
)

func TestSystemReservedLeavesTheContract(t *testing.T) {
	host := hostCapacity{MilliCPU: 2000, MemBytes: 24 << 30}
	for _, c := range []struct {
		name        string
		cpus, mem   int
		wantCPU     int64
		wantMemByte int64
	}{
		{"one cpu, 1 GiB", 1, 1024, 1000, 24<<30 - 1<<30 - evictionHardMemoryBytes},
		{"the whole host's cpus", 2, 512, 0, 24<<30 - 512<<20 - evictionHardMemoryBytes},
		{"more than the host", 8, 64 << 10, 0, 0},
		{"unset", 0, 0, 0, 0},
	} {
		cpu, mem := systemReserved(host, c.cpus, c.mem)
		if cpu != c.wantCPU || mem != c.wantMemByte {
			t.Errorf("%s: reserved %dm %d B; want %dm %d B", c.name, cpu, mem, c.wantCPU, c.wantMemByte)
		}
		// What the kubelet will advertise: capacity - reserved - evictionHard.
		if c.cpus > 0 && c.cpus*1000 <= 2000 {
			if got := host.MilliCPU - cpu; got != int64(c.cpus)*1000 {
				t.Errorf("%s: allocatable cpu %dm", c.name, got)
			}
		}
		if c.mem > 0 && int64(c.mem)<<20 < host.MemBytes {
			if got := host.MemBytes - mem - evictionHardMemoryBytes; got != int64(c.mem)<<20 {
				t.Errorf("%s: allocatable memory %d B", c.name, got)
			}
		}
	}
}

func TestKubeletConfigReservesBeyondTheContract(t *testing.T) {
	ns := nodeState{Dir: "/d", RunDir: "/run/swnode/x", NodeIP: "10.78.0.6", CPUs: 1, MemMiB: 1024}
	got := systemReservedConfig(ns, hostCapacity{MilliCPU: 2000, MemBytes: 4 << 30})
	if want := `systemReserved: {cpu: 1000m, memory: "3220176896"}` + "\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := systemReservedConfig(nodeState{}, hostCapacity{MilliCPU: 2000, MemBytes: 4 << 30}); got != "" {
		t.Errorf("no contract figures: %q", got)
	}
	if !strings.Contains(kubeletConfig(ns), "systemReserved: {cpu: ") {
		t.Errorf("the kubelet config reserves nothing:\n%s", kubeletConfig(ns))
	}
}
