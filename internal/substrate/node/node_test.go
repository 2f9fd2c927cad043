package node

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"socialweb.computer/internal/netpol/podgate"
	"socialweb.computer/internal/substrate"
)

// The image tarball is an OCI image layout holding one named image; when containerd's ctr
// is installed, `ctr images import` of it into a throwaway containerd is covered by the e2e
// row (test/e2e TestNode_JoinsTenantClusterAndRunsAPod).
func TestWriteOCIImage(t *testing.T) {
	if _, err := os.Stat(BusyboxStatic); err != nil {
		t.Skip(err)
	}
	p := filepath.Join(t.TempDir(), "busybox.tar")
	if err := WriteBusyboxImage(p); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		names[h.Name] = b
	}
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(names["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, names["index.json"])
	}
	m := index.Manifests[0]
	if m.Annotations["io.containerd.image.name"] != BusyboxImage {
		t.Errorf("annotations %v", m.Annotations)
	}
	if _, ok := names["blobs/sha256/"+strings.TrimPrefix(m.Digest, "sha256:")]; !ok {
		t.Errorf("manifest blob %s missing", m.Digest)
	}
	if string(names["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout %q", names["oci-layout"])
	}
	// Deterministic: the same inputs give the same bytes.
	p2 := filepath.Join(t.TempDir(), "again.tar")
	_ = WriteBusyboxImage(p2)
	a, _ := os.ReadFile(p)
	b, _ := os.ReadFile(p2)
	if string(a) != string(b) {
		t.Error("two writes of the same image differ")
	}
}

func TestConfigsPinTheHostSettings(t *testing.T) {
	ns := nodeState{Dir: "/d", RunDir: "/run/swnode/x", NodeIP: "10.78.0.6", PodSubnet: "10.88.0.0/24"}
	cd := containerdConfig(ns)
	for _, want := range []string{"restrict_oom_score_adj = true", "netns_mounts_under_state_dir = true", `sandbox_image = "` + PauseImage + `"`,
		`address = "/run/swnode/x/containerd.sock"`, `Root = "/run/swnode/x/runc"`, "SystemdCgroup = false", `bin_dir = "/usr/lib/cni"`} {
		if !strings.Contains(cd, want) {
			t.Errorf("containerd config lacks %q", want)
		}
	}
	kc := kubeletConfig(ns)
	for _, want := range []string{"failCgroupV1: false", "cgroupsPerQOS: true", "cgroupRoot: /", "cgroupDriver: cgroupfs", "address: 10.78.0.6", `resolvConf: ""`, "clusterDNS: [169.254.20.10]", "clusterDomain: cluster.local", "readOnlyPort: 0",
		// The kubelet's API serves what its owner's pods need (logs, exec, port-forward), not
		// the node's /var/log or its profile.
		"enableSystemLogHandler: false", "enableProfilingHandler: false"} {
		if !strings.Contains(kc, want) {
			t.Errorf("kubelet config lacks %q", want)
		}
	}
	if h, n := addrs(1); h != "10.78.0.5" || n != "10.78.0.6" {
		t.Errorf("addrs(1) = %s %s", h, n)
	}
	if h, n := addrs(64); h != "10.78.1.1" || n != "10.78.1.2" {
		t.Errorf("addrs(64) = %s %s", h, n)
	}
}

func TestBootRefusesInvalidSpecs(t *testing.T) {
	if err := Prerequisites(); err != nil {
		if _, lerr := exec.LookPath("containerd"); lerr != nil && !errors.Is(err, substrate.ErrUnavailable) {
			t.Fatalf("missing containerd is not ErrUnavailable: %v", err)
		}
		t.Skip(err)
	}
	s, err := New(Config{StateDir: t.TempDir(), Binary: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string][]byte{SecretKubeconfig: []byte("x"), SecretCA: []byte("y")}
	for name, spec := range map[string]substrate.GuestSpec{
		"not json":      {ID: "a", UserData: []byte("nope"), Secrets: secrets},
		"remote server": {ID: "a", UserData: []byte(`{"server":"https://10.0.0.1:6443","nodeName":"n"}`), Secrets: secrets},
		"bad node name": {ID: "a", UserData: []byte(`{"server":"https://127.0.0.1:6443","nodeName":"N_1"}`), Secrets: secrets},
		"no bundle":     {ID: "a", UserData: []byte(`{"server":"https://127.0.0.1:6443","nodeName":"n"}`)},
		"ports":         {ID: "a", UserData: []byte(`{"server":"https://127.0.0.1:6443","nodeName":"n"}`), Secrets: secrets, Ports: []substrate.Port{{Name: "p", Guest: 80}}},
		"taint effect":  {ID: "a", UserData: []byte(`{"server":"https://127.0.0.1:6443","nodeName":"n","taints":["a=b:Never"]}`), Secrets: secrets},
		"yaml in taint": {ID: "a", UserData: []byte(`{"server":"https://127.0.0.1:6443","nodeName":"n","taints":["a\nregisterNode: false:NoSchedule"]}`), Secrets: secrets},
		"cluster label": {ID: "a", UserData: []byte(`{"server":"https://127.0.0.1:6443","nodeName":"n","labels":{"node-role.kubernetes.io/control-plane":""}}`), Secrets: secrets},
		"comma label":   {ID: "a", UserData: []byte(`{"server":"https://127.0.0.1:6443","nodeName":"n","labels":{"a":"b,c=d"}}`), Secrets: secrets},
	} {
		if _, err := s.Boot(context.Background(), spec); !errors.Is(err, substrate.ErrInvalidSpec) {
			t.Errorf("%s: %v, want ErrInvalidSpec", name, err)
		}
	}
	if _, err := s.Status(context.Background(), "a"); !errors.Is(err, substrate.ErrNotFound) {
		t.Errorf("a refused spec left a guest: %v", err)
	}
}

// A host without containerd and runc of its own runs namespace nodes on a node runtime dir:
// only then are the host's runtime binaries not required.
func TestPrerequisitesAskTheHostRuntimeOnlyWhenItRuns(t *testing.T) {
	if err := Prerequisites(); err != nil {
		t.Skip(err) // this host lacks more than the runtime
	}
	bin := t.TempDir()
	for _, b := range []string{"ip", "nsenter", "setpriv", "iptables", "mkfs.ext4", "unshare"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin)
	if err := prerequisites(false); err != nil {
		t.Errorf("with a node runtime dir: %v, want nil", err)
	}
	err := prerequisites(true)
	if err == nil || !errors.Is(err, substrate.ErrUnavailable) || !strings.Contains(err.Error(), "containerd, containerd-shim-runc-v2, runc, ctr") {
		t.Errorf("on the host's runtime without it: %v, want ErrUnavailable naming containerd, the shim, runc and ctr", err)
	}
}

func TestParseOverlay(t *testing.T) {
	for _, tc := range []struct {
		addr, ports string
		want        string
		first, last uint16
		bad         bool
	}{
		{addr: "", ports: "", want: "invalid IP", first: 51821, last: 52820},
		{addr: "198.51.100.7", want: "198.51.100.7", first: 51821, last: 52820},
		{addr: " 203.0.113.9 ", ports: "40000-40009", want: "203.0.113.9", first: 40000, last: 40009},
		{addr: "", ports: "40000-40009", bad: true},     // ports of no address
		{addr: "10.78.0.2", bad: true},                  // a node link address
		{addr: "10.42.1.1", bad: true},                  // a pod address
		{addr: "127.0.0.1", bad: true},                  // loopback reaches no other host
		{addr: "2001:db8::1", bad: true},                // the overlay is IPv4
		{addr: "overlay.example.org", bad: true},        // nothing is resolved
		{addr: "198.51.100.7", ports: "9-1", bad: true}, // a backwards range
	} {
		a, r, err := parseOverlay(tc.addr, tc.ports)
		if (err != nil) != tc.bad {
			t.Errorf("parseOverlay(%q, %q): error %v, want error %v", tc.addr, tc.ports, err, tc.bad)
			continue
		}
		if !tc.bad && (a.String() != tc.want || r.First != tc.first || r.Last != tc.last) {
			t.Errorf("parseOverlay(%q, %q) = %s %v, want %s %d-%d", tc.addr, tc.ports, a, r, tc.want, tc.first, tc.last)
		}
	}
}

// With the gate, the node's containerd looks for plugins in the node's own dir, which links
// the host's plugins and the gate's binary under its plugin name, and the CNI config chains
// the gate after the bridge (which assigns the address it reports); without it (a node
// booted before, or a vm node) neither changes.
func TestCNIGateConfig(t *testing.T) {
	dir := t.TempDir()
	ns := nodeState{Dir: dir, RunDir: "/run/swnode/x", NodeIP: "10.78.0.6", CNIGate: "/opt/sw/socialweb-cni-netpol"}
	if err := writeCNIBinDir(ns); err != nil {
		t.Fatal(err)
	}
	bin := ns.work("cni", "bin")
	for name, want := range map[string]string{podgate.PluginName: ns.CNIGate, "bridge": CNIBinDir + "/bridge", "host-local": CNIBinDir + "/host-local", "loopback": CNIBinDir + "/loopback"} {
		if got, err := os.Readlink(filepath.Join(bin, name)); err != nil || got != want {
			t.Errorf("%s links to %q (%v), want %q", name, got, err, want)
		}
	}
	if err := writeCNIBinDir(ns); err != nil {
		t.Fatalf("a second start: %v", err)
	}
	if cd := containerdConfig(ns); !strings.Contains(cd, `bin_dir = "`+bin+`"`) {
		t.Errorf("containerd config does not name the node's plugin dir:\n%s", cd)
	}
	var conf struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(cniConfig(ns, "10.42.1.0/24")), &conf); err != nil {
		t.Fatal(err)
	}
	if len(conf.Plugins) != 2 || conf.Plugins[0]["type"] != "bridge" || conf.Plugins[1]["type"] != podgate.PluginName ||
		conf.Plugins[1]["socket"] != "/run/swnode/x/netpol.sock" {
		t.Errorf("plugins %v: want the bridge, then the gate on the node's socket", conf.Plugins)
	}

	ns.CNIGate = ""
	if cd := containerdConfig(ns); !strings.Contains(cd, `bin_dir = "`+CNIBinDir+`"`) {
		t.Errorf("without the gate, containerd config does not name the host's plugin dir")
	}
	if c := cniConfig(ns, "10.42.1.0/24"); strings.Contains(c, podgate.PluginName) {
		t.Errorf("without the gate, the CNI config chains it:\n%s", c)
	}
}

// Every block is tried once, none is 0 (the host's own range start), and nodes with
// different IDs start at different blocks: two hosts' first nodes rarely share an address.
func TestIndexOrderSpreadsNodesOverTheRange(t *testing.T) {
	starts := map[int]bool{}
	for i := range 200 {
		order := indexOrder(fmt.Sprintf("g%016x", i*7919))
		if len(order) != maxNodes-1 {
			t.Fatalf("%d blocks, want %d", len(order), maxNodes-1)
		}
		seen := map[int]bool{}
		for _, b := range order {
			if b < 1 || b >= maxNodes || seen[b] {
				t.Fatalf("block %d out of range or tried twice", b)
			}
			seen[b] = true
		}
		starts[order[0]] = true
	}
	// 200 draws from 4095 blocks: about 5 collide.
	if len(starts) < 180 {
		t.Errorf("200 node IDs start at %d distinct blocks, want them spread", len(starts))
	}
	if a, b := indexOrder("same"), indexOrder("same"); a[0] != b[0] {
		t.Errorf("one ID starts at %d then %d, want the same block", a[0], b[0])
	}
}
