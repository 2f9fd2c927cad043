package vm

import (
	"context"

	"socialweb.computer/internal/substrate"
)

// layers are what Boot applies to every guest besides the machine itself and its
// accelerator (added by Isolation): none yet. Extend the list only with a layer Boot applies
// to every guest and a test attacks (watch it fail without the layer first): the bidder
// publishes it in its offering, and requesters choose bidders by it.
var layers = []string{}

// Isolation implements substrate.Substrate: a machine per guest, with its own kernel,
// under the accelerator guests boot with (kvm, or tcg when the probe found no usable KVM).
// The probe is cached per host boot, so this costs one test boot per host boot at most; a
// probe that fails leaves the accelerator out.
func (s *Substrate) Isolation() substrate.Isolation {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ProbeTimeout*2)
	defer cancel()
	out := substrate.Isolation{Boundary: substrate.BoundaryVM, Layers: append([]string(nil), layers...)}
	if accel, err := s.Accelerator(ctx); err == nil {
		out.Layers = append(out.Layers, accelLayer(accel))
	}
	return out
}

func accelLayer(accel string) string {
	if accel == KVM {
		return substrate.LayerKVM
	}
	return substrate.LayerTCG
}

// Arch implements substrate.Architected: the machine is qemu-system-x86_64's, on any host.
func (s *Substrate) Arch() string { return "amd64" }
