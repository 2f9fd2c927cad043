package nodedns

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestChooseUpstreams(t *testing.T) {
	for _, tc := range []struct {
		name, setting, resolvConf string
		want                      []string
		err                       error
	}{
		{name: "host's first non-loopback nameserver", resolvConf: "search x\nnameserver 127.0.0.53\nnameserver 192.0.2.53\nnameserver 192.0.2.54\n", want: []string{"192.0.2.53:53"}},
		{name: "ipv6 with a zone", resolvConf: "nameserver ::1\nnameserver fe80::1%eth0\n", want: []string{"[fe80::1]:53"}},
		{name: "host has only loopback", resolvConf: "nameserver 127.0.0.1\nnameserver ::1\n"},
		{name: "host has none", resolvConf: "# empty\n"},
		{name: "unspecified is no resolver", resolvConf: "nameserver 0.0.0.0\n"},
		{name: "operator none wins over the host", setting: "none", resolvConf: "nameserver 192.0.2.53\n"},
		{name: "operator list", setting: "198.51.100.53, 203.0.113.53:5353", resolvConf: "nameserver 192.0.2.53\n", want: []string{"198.51.100.53:53", "203.0.113.53:5353"}},
		{name: "operator ipv6", setting: "2001:db8::53", want: []string{"[2001:db8::53]:53"}},
		{name: "a name is refused, never resolved", setting: "dns.example.", err: ErrUpstream},
		{name: "port zero", setting: "192.0.2.1:0", err: ErrUpstream},
		{name: "loopback is the node itself", setting: "127.0.0.53", err: ErrUpstream},
		{name: "the node-local address loops", setting: "169.254.20.10:53", err: ErrUpstream},
		{name: "one bad entry spoils the list", setting: "192.0.2.1,,", err: ErrUpstream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why, err := ChooseUpstreams(tc.setting, []byte(tc.resolvConf))
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err == nil && why == "" {
				t.Error("no reason given")
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCorefile(t *testing.T) {
	base := Config{Listen: "169.254.20.10", Domain: "cluster.local", Kubeconfig: "/n/kc"}
	withUp := base
	withUp.Upstreams = []string{"192.0.2.53:53", "192.0.2.54:53"}

	for _, tc := range []struct {
		name        string
		c           Config
		has, hasNot []string
	}{
		{name: "no upstream: nothing after kubernetes, so other names are SERVFAIL", c: base,
			has:    []string{"bind 169.254.20.10\n", "kubernetes cluster.local in-addr.arpa ip6.arpa {", "kubeconfig /n/kc\n", "pods insecure"},
			hasNot: []string{"forward", "fallthrough"}},
		{name: "upstreams: reverse names fall through to forward", c: withUp,
			has: []string{"fallthrough in-addr.arpa ip6.arpa\n", "forward . 192.0.2.53:53 192.0.2.54:53\n"}, hasNot: []string{"loop"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cf := Corefile(tc.c)
			for _, s := range tc.has {
				if !strings.Contains(cf, s) {
					t.Errorf("Corefile lacks %q:\n%s", s, cf)
				}
			}
			for _, s := range tc.hasNot {
				if strings.Contains(cf, s) {
					t.Errorf("Corefile has %q:\n%s", s, cf)
				}
			}
			// The cluster's names only from the cluster: the kubernetes block names no
			// fallthrough for the cluster's own domain.
			if strings.Contains(cf, "fallthrough cluster.local") || strings.Contains(cf, "fallthrough\n") {
				t.Errorf("cluster names fall through to the upstream:\n%s", cf)
			}
		})
	}
}
