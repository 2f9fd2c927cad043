package node

import (
	"slices"
	"testing"

	"socialweb.computer/internal/hostcheck"
)

// The host check names this package's paths and flavours without importing it (it would
// bring the kubelet into `socialweb check-host`'s package): the copies must not drift.
func TestHostCheckAgreesWithTheNodeSubstrate(t *testing.T) {
	for _, c := range []struct{ name, check, node string }{
		{"flavour namespace", hostcheck.FlavourNamespace, FlavourNamespace},
		{"flavour vm", hostcheck.FlavourVM, FlavourVM},
		{"flavour auto", hostcheck.FlavourAuto, FlavourAuto},
		{"host runtime", hostcheck.HostRuntime, HostRuntime},
		{"CNI dir", hostcheck.CNIBinDir, CNIBinDir},
		{"busybox", hostcheck.BusyboxStatic, BusyboxStatic},
	} {
		if c.check != c.node {
			t.Errorf("%s: the host check says %q, the node substrate %q", c.name, c.check, c.node)
		}
	}
	if !slices.Equal(hostcheck.RuntimeBinaries, runtimeBinaries) {
		t.Errorf("runtime binaries: the host check says %v, the node substrate %v", hostcheck.RuntimeBinaries, runtimeBinaries)
	}
}
