package kube

import (
	"context"
	"errors"

	"k8s.io/apiserver/pkg/admission"
	"k8s.io/kubernetes/pkg/apis/core"
)

// ErrHostUsers refuses a pod that asks to run with the node host's uids (hostUsers: true)
// in a cluster that runs every pod in a user namespace of its own.
var ErrHostUsers = errors.New("this cluster runs every pod in a user namespace of its own (spec.hostUsers: false), so that uid 0 in a pod is an unprivileged uid on the node's host; its provider requires it: leave spec.hostUsers unset or false")

// defaultHostUsers is the floor's mutation of a new pod in a cluster that requires user
// namespaces: hostUsers: false when the pod does not say. A pod that asks for a host
// namespace is left as it is: Pod Security refuses it with its own reason (the apiserver's
// "hostPID: Forbidden when hostUsers is false" would hide it), and Validate refuses it if
// Pod Security did not. It reports whether it changed pod.
func defaultHostUsers(pod *core.Pod) bool {
	if pod.Spec.HostUsers != nil {
		return false
	}
	if s := pod.Spec; s.HostNetwork || s.HostPID || s.HostIPC {
		return false
	}
	no := false
	pod.Spec.HostUsers = &no
	return true
}

// checkHostUsers is nil when pod runs in a user namespace of its own (hostUsers: false).
func checkHostUsers(pod *core.Pod) error {
	if pod.Spec.HostUsers != nil && !*pod.Spec.HostUsers {
		return nil
	}
	return ErrHostUsers
}

// newPod is the pod a request creates, or nil for any other request (an update, a
// subresource: hostUsers cannot change after creation).
func newPod(a admission.Attributes) *core.Pod {
	if a.GetResource().GroupResource() != core.Resource("pods") || a.GetOperation() != admission.Create || a.GetSubresource() != "" {
		return nil
	}
	pod, _ := a.GetObject().(*core.Pod)
	return pod
}

var _ admission.MutationInterface = (*floor)(nil)

// Admit sets hostUsers: false on a new pod that does not say, in a cluster that requires user
// namespaces (Validate then refuses one that asked for hostUsers: true).
func (f *floor) Admit(_ context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	if !f.userNamespaces {
		return nil
	}
	if pod := newPod(a); pod != nil {
		defaultHostUsers(pod)
	}
	return nil
}

// validateHostUsers is the floor's check of a new pod's user namespace.
func (f *floor) validateHostUsers(a admission.Attributes) error {
	if !f.userNamespaces {
		return nil
	}
	pod := newPod(a)
	if pod == nil {
		return nil
	}
	if err := checkHostUsers(pod); err != nil {
		return admission.NewForbidden(a, err)
	}
	return nil
}
