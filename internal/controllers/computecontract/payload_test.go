package computecontract

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/substrate/node"
)

func TestPayloadOf(t *testing.T) {
	vm, err := payloadOf(v1alpha1.ComputeContractSpec{}, nil)
	if err != nil || *vm.ComputeKind != mk.ComputeVMComputeKindVM || vm.UserData != nil || vm.Cpus != 1 || vm.Mem != 256 {
		t.Fatalf("empty spec: %+v %v, want kind vm, no userData, 1 CPU and 256 MiB", vm, err)
	}
	vm, err = payloadOf(v1alpha1.ComputeContractSpec{CPUs: 2, MemMiB: 1536}, nil)
	if err != nil || vm.Cpus != 2 || vm.Mem != 1536 {
		t.Fatalf("sized spec: %+v %v, want 2 CPUs and 1536 MiB", vm, err)
	}
	vm, err = payloadOf(v1alpha1.ComputeContractSpec{ComputeKind: v1alpha1.ComputeKindDeno, UserData: "console.log(1)"}, []string{"token"})
	if err != nil || *vm.ComputeKind != "deno" || *vm.UserData != "console.log(1)" || len(vm.Secrets) != 1 {
		t.Fatalf("deno: %+v %v", vm, err)
	}

	// A node contract's userData is its join, as the node substrate reads it; the bundle's
	// credentials are secrets, named only.
	spec := v1alpha1.ComputeContractSpec{ComputeKind: v1alpha1.ComputeKindNode,
		NodeJoin: &v1alpha1.NodeJoin{Server: "https://127.0.0.1:6443", NodeName: "n-abc", BundleSecretRef: &v1alpha1.SecretKeyRef{Name: "b"},
			Labels: map[string]string{"pool": "a"}, Taints: []string{"node.socialweb.computer/unregistered:NoSchedule"}},
		SecretsRef: &v1alpha1.SecretKeyRef{Name: "b"}}
	vm, err = payloadOf(spec, []string{"ca", "kubeconfig"})
	if err != nil || *vm.ComputeKind != mk.ComputeVMComputeKindNode || vm.UserData == nil {
		t.Fatalf("node: %+v %v", vm, err)
	}
	var j node.Join
	want := node.Join{Server: "https://127.0.0.1:6443", NodeName: "n-abc", Labels: map[string]string{"pool": "a"},
		Taints: []string{"node.socialweb.computer/unregistered:NoSchedule"}}
	if err := json.Unmarshal([]byte(*vm.UserData), &j); err != nil || !reflect.DeepEqual(j, want) {
		t.Fatalf("node userData %q: %+v %v", *vm.UserData, j, err)
	}

	spec.UserData = "#!/bin/sh"
	_, err = payloadOf(spec, nil)
	var pe *PayloadError
	if !errors.As(err, &pe) {
		t.Fatalf("node with userData and nodeJoin: %v, want a PayloadError", err)
	}

	// More secrets than the record names: refused before any write, naming the field.
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf("k%02d", i)
	}
	_, err = payloadOf(v1alpha1.ComputeContractSpec{ComputeKind: v1alpha1.ComputeKindDeno}, many)
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "secrets") {
		t.Fatalf("65 secrets: %v, want a PayloadError naming secrets", err)
	}
}

// The size bids are held to is the payload's: the spec's cpus and memMiB, defaulted alike.
func TestAskedSize(t *testing.T) {
	for _, spec := range []v1alpha1.ComputeContractSpec{{}, {CPUs: 2}, {MemMiB: 1536}, {CPUs: 4, MemMiB: 8192}} {
		vm, err := payloadOf(spec, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := askedSize(spec), (market.Size{CPUs: vm.Cpus, MemMiB: vm.Mem}); got != want {
			t.Errorf("askedSize(cpus %d, memMiB %d) = %s, the payload asks %s", spec.CPUs, spec.MemMiB, got, want)
		}
	}
	if got := askedSize(v1alpha1.ComputeContractSpec{}); got != (market.Size{CPUs: 1, MemMiB: 256}) {
		t.Errorf("defaults: %s", got)
	}
}
