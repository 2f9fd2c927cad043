package node

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"socialweb.computer/internal/podnet"
)

// JoinError is a Join the substrate refuses, with the field at fault.
type JoinError struct {
	Field  string
	Reason string
}

func (e *JoinError) Error() string { return e.Field + ": " + e.Reason }

// ParseTaint reads a taint as key[=value]:Effect (kubectl taint's form). The key and value
// are held to the Node API's rules, so the kubelet does not refuse to register on them.
func ParseTaint(s string) (corev1.Taint, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return corev1.Taint{}, fmt.Errorf("%q: want key[=value]:Effect", s)
	}
	kv, effect := s[:i], s[i+1:]
	key, value, _ := strings.Cut(kv, "=")
	if errs := validation.IsQualifiedName(key); len(errs) > 0 {
		return corev1.Taint{}, fmt.Errorf("%q: key: %s", s, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
		return corev1.Taint{}, fmt.Errorf("%q: value: %s", s, strings.Join(errs, "; "))
	}
	switch e := corev1.TaintEffect(effect); e {
	case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		return corev1.Taint{Key: key, Value: value, Effect: e}, nil
	}
	return corev1.Taint{}, fmt.Errorf("%q: effect %q: want NoSchedule, PreferNoSchedule or NoExecute", s, effect)
}

// registerTaints parses the Join's taints.
func (j Join) registerTaints() ([]corev1.Taint, error) {
	var out []corev1.Taint
	for i, s := range j.Taints {
		t, err := ParseTaint(s)
		if err != nil {
			return nil, &JoinError{Field: fmt.Sprintf("taints[%d]", i), Reason: err.Error()}
		}
		out = append(out, t)
	}
	return out, nil
}

// validateLabels holds the Join's labels to what a kubelet may set on its own Node: label
// syntax, and none in the kubernetes.io and k8s.io namespaces (the kubelet refuses to start
// on those it does not know, and NodeRestriction refuses the rest) nor this substrate's own
// (the node reports its user namespaces itself).
func (j Join) validateLabels() error {
	keys := make([]string, 0, len(j.Labels))
	for k := range j.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		field := "labels[" + k + "]"
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return &JoinError{Field: field, Reason: strings.Join(errs, "; ")}
		}
		if errs := validation.IsValidLabelValue(j.Labels[k]); len(errs) > 0 {
			return &JoinError{Field: field, Reason: strings.Join(errs, "; ")}
		}
		domain, _, _ := strings.Cut(k, "/")
		if !strings.Contains(k, "/") {
			domain = ""
		}
		for _, reserved := range []string{"kubernetes.io", "k8s.io"} {
			if domain == reserved || strings.HasSuffix(domain, "."+reserved) {
				return &JoinError{Field: field, Reason: "the " + reserved + " namespace is the cluster's, not the requester's"}
			}
		}
		if k == LabelUserNamespaces {
			return &JoinError{Field: field, Reason: "set by the node itself, from its runtime"}
		}
	}
	return nil
}

// nodeLabelsFlag is the kubelet's --node-labels value for labels, sorted by key; labels are
// valid (validateLabels), so neither keys nor values hold a comma or an equals sign.
func nodeLabelsFlag(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + labels[k]
	}
	return strings.Join(parts, ",")
}

// LocalGate is the join server's address when the control plane runs on the node's own
// host: the tenant gate's loopback listener (Config.LocalGateAddress is another name for it).
const LocalGate = "127.0.0.1"

// checkJoinServer holds a Join's server to what a node may dial for its control plane:
// https to an IPv4 address and a port (never a name: nothing resolves it on the requester's
// say), and either the local gate (127.0.0.1, or localGate: the host's public address where
// its own gates listen too) or an address the bidder's egress policy lets
// pods reach that is not one of the host's own. The agent dials it from the host and serves
// it inside the node, so a server the pods could not reach themselves, or the host's own
// address (its other services), would be a way past the egress policy.
func checkJoinServer(raw string, egress podnet.EgressPolicy, hostAddrs []netip.Addr, localGate string) (netip.AddrPort, error) {
	fail := func(why string) (netip.AddrPort, error) {
		return netip.AddrPort{}, &JoinError{Field: "server", Reason: fmt.Sprintf("%q: %s", raw, why)}
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fail("want https://IP:PORT")
	}
	addr, err := netip.ParseAddr(u.Hostname())
	if err != nil || !addr.Is4() {
		return fail("want an IPv4 address, not a name (nothing resolves names for a node's control plane)")
	}
	port, err := strconv.ParseUint(u.Port(), 10, 16)
	if err != nil || port == 0 {
		return fail("want a port")
	}
	ap := netip.AddrPortFrom(addr, uint16(port))
	if addr.String() == LocalGate || addr.String() == localGate {
		return ap, nil
	}
	for _, h := range hostAddrs {
		if h == addr {
			return fail("an address of this host: a control plane here is joined at " + LocalGate)
		}
	}
	if !egress.Reaches(addr) {
		return fail("not an address this host's pods may reach (the bidder's egress policy)")
	}
	return ap, nil
}

// hostAddrs are the IPv4 addresses of the host's interfaces (none if they cannot be read:
// the egress policy still holds).
func hostAddrs() []netip.Addr {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}
