package node

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"socialweb.computer/internal/podnet"
)

func TestParseTaint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want corev1.Taint
		err  string
	}{
		{in: "node.socialweb.computer/unregistered:NoSchedule", want: corev1.Taint{Key: "node.socialweb.computer/unregistered", Effect: corev1.TaintEffectNoSchedule}},
		{in: "gpu=a100:NoExecute", want: corev1.Taint{Key: "gpu", Value: "a100", Effect: corev1.TaintEffectNoExecute}},
		{in: "spot:PreferNoSchedule", want: corev1.Taint{Key: "spot", Effect: corev1.TaintEffectPreferNoSchedule}},
		{in: "spot", err: "want key[=value]:Effect"},
		{in: "spot:Never", err: `effect "Never"`},
		{in: ":NoSchedule", err: "key"},
		{in: "a=b c:NoSchedule", err: "value"},
		{in: "a\nregisterNode: false:NoSchedule", err: "key"},
	} {
		got, err := ParseTaint(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseTaint(%q) = %v, %v; want an error naming %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseTaint(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestJoinLabels(t *testing.T) {
	for _, tc := range []struct {
		labels map[string]string
		field  string
	}{
		{labels: map[string]string{"team": "a", "socialweb.computer/pool": "x"}},
		{labels: map[string]string{"kubernetes.io/hostname": "other"}, field: "labels[kubernetes.io/hostname]"},
		{labels: map[string]string{"node.kubernetes.io/instance-type": "x"}, field: "labels[node.kubernetes.io/instance-type]"},
		{labels: map[string]string{"k8s.io/x": "y"}, field: "labels[k8s.io/x]"},
		{labels: map[string]string{LabelUserNamespaces: "true"}, field: "labels[" + LabelUserNamespaces + "]"},
		{labels: map[string]string{"a": "b,c=d"}, field: "labels[a]"},
		{labels: map[string]string{"a=b": "c"}, field: "labels[a=b]"},
	} {
		err := Join{Labels: tc.labels}.validateLabels()
		var je *JoinError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%v: %v", tc.labels, err)
		case tc.field != "" && (!errors.As(err, &je) || je.Field != tc.field):
			t.Errorf("%v: %v, want a JoinError on %s", tc.labels, err, tc.field)
		}
	}
	if got := nodeLabelsFlag(map[string]string{"b": "2", "a": "1"}); got != "a=1,b=2" {
		t.Errorf("nodeLabelsFlag = %q", got)
	}
}

func TestKubeletConfigRegistersTheJoinsTaints(t *testing.T) {
	ns := nodeState{Dir: "/d", RunDir: "/run/swnode/x", NodeIP: "10.78.0.6"}
	if kc := kubeletConfig(ns); strings.Contains(kc, "registerWithTaints") {
		t.Errorf("a Join without taints registers with some:\n%s", kc)
	}
	taints, err := Join{Taints: []string{"node.socialweb.computer/unregistered:NoSchedule", "gpu=a100:NoExecute"}}.registerTaints()
	if err != nil {
		t.Fatal(err)
	}
	ns.Taints = taints
	want := `registerWithTaints: [{"key":"node.socialweb.computer/unregistered","effect":"NoSchedule"},{"key":"gpu","value":"a100","effect":"NoExecute"}]` + "\n"
	if kc := kubeletConfig(ns); !strings.Contains(kc, want) {
		t.Errorf("kubelet config lacks %q:\n%s", want, kc)
	}
}

func TestCheckJoinServer(t *testing.T) {
	egress, err := podnet.ParseEgressPolicy([]string{"10.1.2.0/24"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	host := []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("10.1.2.1")}
	for _, tc := range []struct {
		server string
		want   string // the AddrPort, or "" for a refusal
	}{
		{"https://127.0.0.1:6443", "127.0.0.1:6443"},
		{"https://198.51.100.7:443", "198.51.100.7:443"}, // a control plane on another host
		{"https://10.1.2.9:6443", "10.1.2.9:6443"},       // on the operator's allowed private range
		{"https://203.0.113.10:22", ""},                  // this host's own address: its sshd
		{"https://10.1.2.1:6443", ""},                    // this host's, on the allowed range
		{"https://192.168.1.1:6443", ""},                 // the provider's network
		{"https://169.254.169.254:80", ""},               // the cloud's metadata service
		{"https://127.0.0.2:6443", ""},
		{"https://10.43.0.1:443", ""}, // the service network
		{"https://10.78.0.6:10250", ""},
		{"http://198.51.100.7:443", ""},
		{"https://gate.example:443", ""}, // a name
		{"https://198.51.100.7", ""},     // no port
		{"https://198.51.100.7:0", ""},
		{"https://[2001:db8::1]:443", ""},
		{"https://[::ffff:198.51.100.7]:443", ""},
		{"https://u:p@198.51.100.7:443", ""},
		{"https://198.51.100.7:443/x", ""},
	} {
		got, err := checkJoinServer(tc.server, egress, host, "")
		var je *JoinError
		switch {
		case tc.want == "" && !errors.As(err, &je):
			t.Errorf("%s: %v %v, want a JoinError", tc.server, got, err)
		case tc.want != "" && (err != nil || got.String() != tc.want):
			t.Errorf("%s: %v %v, want %s", tc.server, got, err, tc.want)
		}
	}
}

// This host's public address is refused unless the operator named it as where its own tenant
// gates listen (up --tenant-address).
func TestCheckJoinServerLocalGateAddress(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("203.0.113.10")}
	if _, err := checkJoinServer("https://203.0.113.10:41234", podnet.EgressPolicy{}, host, ""); err == nil {
		t.Error("the host's own address without --tenant-address: accepted")
	}
	if ap, err := checkJoinServer("https://203.0.113.10:41234", podnet.EgressPolicy{}, host, "203.0.113.10"); err != nil || ap.String() != "203.0.113.10:41234" {
		t.Errorf("the host's tenant address: %v %v", ap, err)
	}
}
