package node

import "testing"

func TestKubeletCPUManager(t *testing.T) {
	for _, tc := range []struct {
		name     string
		online   []int
		nodeCPUs string
		want     string
	}{
		{"no cpuset: the none policy", []int{0, 1}, "", ""},
		{"bound to every CPU: the none policy", []int{0, 1}, "0-1", ""},
		{"bound to one of two: the other is reserved", []int{0, 1}, "1", "cpuManagerPolicy: static\ncpuManagerPolicyOptions: {strict-cpu-reservation: \"true\"}\nreservedSystemCPUs: \"0\"\n"},
		{"bound to two of eight", []int{0, 1, 2, 3, 4, 5, 6, 7}, "2,5", "cpuManagerPolicy: static\ncpuManagerPolicyOptions: {strict-cpu-reservation: \"true\"}\nreservedSystemCPUs: \"0-1,3-4,6-7\"\n"},
		{"online unknown: the none policy", nil, "1", ""},
		{"an unreadable cpuset: the none policy", []int{0, 1}, "x", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := kubeletCPUManager(tc.online, tc.nodeCPUs); got != tc.want {
				t.Errorf("kubeletCPUManager(%v, %q) = %q, want %q", tc.online, tc.nodeCPUs, got, tc.want)
			}
		})
	}
}
