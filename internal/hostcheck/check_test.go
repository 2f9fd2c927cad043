package hostcheck

import (
	"errors"
	"strings"
	"testing"
)

// fullHost has everything every area needs.
func fullHost() Host {
	h := Host{EUID: 0, Kernel: "6.18.0", Tools: map[string]string{}, Files: map[string]bool{},
		Namespaces:  []string{"mnt", "net", "pid", "user"},
		Cgroups:     Cgroups{Layout: "v2"},
		KVM:         KVM{Usable: true},
		Deno:        Deno{Path: "/repo/.cache/deno/deno", Where: "the project's .cache/deno"},
		VMImage:     VMImage{Dir: "/state/images/vm", Present: true, NodeModules: true},
		NodeRuntime: NodeRuntime{Dir: "/repo/bin/node-runtime"},
		Addresses:   []string{"127.0.0.1", "192.0.2.10"},
	}
	for _, t := range AllTools() {
		h.Tools[t] = "/usr/bin/" + t
	}
	for _, f := range AllFiles() {
		h.Files[f] = true
	}
	return h
}

func upDefaults() Config {
	return Config{Deno: true, Tenants: true, NodeFlavour: FlavourAuto, VMImage: "/state/images/vm"}
}

func find(t *testing.T, rows []Row, area, req string) Row {
	t.Helper()
	for _, r := range rows {
		if r.Area == area && r.Requirement == req {
			return r
		}
	}
	t.Fatalf("no row %s / %s", area, req)
	return Row{}
}

func TestCheck(t *testing.T) {
	type want struct {
		area, req string
		status    Status
		needed    bool
		fix       string // a substring of Fix
	}
	for _, tc := range []struct {
		name  string
		host  func(*Host)
		cfg   func(*Config)
		ready bool
		rows  []want
	}{
		{name: "everything holds", ready: true, rows: []want{
			{AreaDeno, "deno", Holds, true, ""},
			{AreaNodes, "containerd", Holds, true, ""},
			{AreaNodes, "pods with hostUsers: false", Holds, false, ""},
			{AreaVM, "qemu-system-x86_64", Holds, false, ""},
			{AreaTenants, "advertise address", Holds, true, ""},
		}},
		{name: "no deno", host: func(h *Host) { h.Deno = Deno{} }, rows: []want{
			{AreaDeno, "deno", Missing, true, "socialweb install-deps"},
		}},
		{name: "no deno, deno off", host: func(h *Host) { h.Deno = Deno{} }, cfg: func(c *Config) { c.Deno = false }, ready: true, rows: []want{
			{AreaDeno, "deno", Missing, false, "socialweb install-deps"},
		}},
		{name: "not root", host: func(h *Host) { h.EUID = 1000 }, rows: []want{
			{AreaDeno, "root", Missing, true, "run as root"},
			{AreaNodes, "root", Missing, true, "run as root"},
			{AreaTenants, "advertise address", MustBePassedIn, true, "--tenant-advertise-address"},
		}},
		{name: "not root, address passed in", host: func(h *Host) { h.EUID = 1000 }, cfg: func(c *Config) {
			c.Deno, c.Tenants, c.TenantAdvertise = false, true, "192.0.2.10"
		}, rows: []want{
			{AreaTenants, "advertise address", Holds, true, ""},
			{AreaNodes, "root", Missing, true, "run as root"},
		}},
		{name: "address passed in is not here", cfg: func(c *Config) { c.TenantAdvertise = "198.51.100.1" }, rows: []want{
			{AreaTenants, "advertise address", MustBePassedIn, true, "--tenant-advertise-address"},
		}},
		{name: "no qemu, auto flavour: namespace nodes, ready", host: func(h *Host) { delete(h.Tools, "qemu-system-x86_64") }, ready: true, rows: []want{
			{AreaVM, "qemu-system-x86_64", Missing, false, "apt-get install -y qemu-system-x86"},
		}},
		{name: "no qemu, vm flavour", host: func(h *Host) { delete(h.Tools, "qemu-system-x86_64") }, cfg: func(c *Config) { c.NodeFlavour = FlavourVM }, rows: []want{
			{AreaVM, "qemu-system-x86_64", Missing, true, "apt-get install -y qemu-system-x86"},
		}},
		{name: "no image, vm flavour", host: func(h *Host) { h.VMImage = VMImage{Dir: "/state/images/vm", Err: "no image"} }, cfg: func(c *Config) { c.NodeFlavour = FlavourVM }, rows: []want{
			{AreaVM, "vm image", Missing, true, "socialweb image build --out /state/images/vm"},
			{AreaVMNodes, "vm image with node modules", Missing, true, "socialweb image build"},
		}},
		{name: "no image and no apt, vm flavour", host: func(h *Host) {
			h.VMImage = VMImage{Dir: "/state/images/vm", Err: "no image"}
			delete(h.Tools, "apt-get")
		}, cfg: func(c *Config) { c.NodeFlavour = FlavourVM }, rows: []want{
			{AreaVM, "vm image", MustBePassedIn, true, "--vm-image DIR"},
			{AreaVM, "apt-get (image build)", Missing, false, "apt-get install -y apt"},
		}},
		{name: "old image, vm flavour", host: func(h *Host) { h.VMImage.NodeModules = false }, cfg: func(c *Config) { c.NodeFlavour = FlavourVM }, rows: []want{
			{AreaVMNodes, "vm image with node modules", Missing, true, "socialweb image build"},
		}},
		{name: "no kvm: never blocks", host: func(h *Host) { h.KVM = KVM{Err: "permission denied"} }, cfg: func(c *Config) { c.NodeFlavour = FlavourVM }, ready: true, rows: []want{
			{AreaVM, "/dev/kvm", Missing, false, "tcg"},
		}},
		{name: "no CNI plugins", host: func(h *Host) { delete(h.Files, CNIBinDir+"/bridge") }, rows: []want{
			{AreaNodes, CNIBinDir + "/bridge", Missing, true, "apt-get install -y containernetworking-plugins"},
		}},
		{name: "no busybox, no nft, no ip", host: func(h *Host) {
			delete(h.Files, BusyboxStatic)
			delete(h.Tools, "nft")
			delete(h.Tools, "ip")
		}, rows: []want{
			{AreaNodes, BusyboxStatic, Missing, true, "apt-get install -y busybox-static"},
			{AreaNodes, "nft", Missing, true, "apt-get install -y nftables"},
			{AreaNodes, "ip", Missing, true, "apt-get install -y iproute2"},
			{AreaTenants, "advertise address", MustBePassedIn, true, "--tenant-advertise-address"},
		}},
		{name: "no tenants: node rows unused", host: func(h *Host) { delete(h.Tools, "containerd") }, cfg: func(c *Config) { c.Tenants = false }, ready: true, rows: []want{
			{AreaNodes, "containerd", Missing, false, "apt-get install -y containerd"},
		}},
		{name: "namespace nodes on the node runtime: no host containerd needed", host: func(h *Host) {
			delete(h.Tools, "containerd")
			delete(h.Tools, "runc")
		}, cfg: func(c *Config) { c.NodeFlavour = FlavourNamespace }, ready: true, rows: []want{
			{AreaNodes, "containerd", Missing, false, "apt-get install -y containerd"},
			{AreaNodes, "runc", Missing, false, "apt-get install -y runc"},
		}},
		{name: "namespace nodes on the host's runtime need it", host: func(h *Host) { delete(h.Tools, "containerd") },
			cfg: func(c *Config) { c.NodeFlavour, c.NodeRuntime = FlavourNamespace, HostRuntime }, rows: []want{
				{AreaNodes, "containerd", Missing, true, "apt-get install -y containerd"},
			}},
		{name: "vm nodes carry the host's runtime", host: func(h *Host) { delete(h.Tools, "ctr") },
			cfg: func(c *Config) { c.NodeFlavour = FlavourVM }, rows: []want{
				{AreaNodes, "ctr", Missing, true, "apt-get install -y containerd"},
			}},
		{name: "no node runtime beside the binary", host: func(h *Host) { h.NodeRuntime.Missing = "runc" }, ready: true, rows: []want{
			{AreaNodes, "node runtime", Holds, true, ""},
			{AreaNodes, "pods with hostUsers: false", Missing, false, "bash hack/build.sh"},
		}},
		{name: "configured node runtime lacks runc", host: func(h *Host) { h.NodeRuntime = NodeRuntime{Dir: "/opt/rt", Missing: "runc"} }, cfg: func(c *Config) { c.NodeRuntime = "/opt/rt" }, rows: []want{
			{AreaNodes, "node runtime", Missing, true, "bash hack/build-node-runtime.sh /opt/rt"},
		}},
		{name: "host runtime", cfg: func(c *Config) { c.NodeRuntime = HostRuntime }, ready: true, rows: []want{
			{AreaNodes, "node runtime", Holds, true, ""},
			{AreaNodes, "pods with hostUsers: false", Missing, false, "bash hack/build.sh"},
		}},
		{name: "no cgroup controllers", host: func(h *Host) { h.Cgroups.Err = "lacks the pids controller" }, rows: []want{
			{AreaDeno, "cgroups", Missing, true, "cgroup"},
		}},
		{name: "no user namespaces", host: func(h *Host) { h.Namespaces = []string{"mnt", "pid"} }, rows: []want{
			{AreaDeno, "namespaces", Missing, true, "CONFIG_NAMESPACES"},
		}},
		{name: "registry config not passed in: optional", ready: true, rows: []want{
			{AreaInput, "registry config", MustBePassedIn, false, "--node-registry-config"},
			{AreaInput, "egress to a private network", MustBePassedIn, false, "--node-egress-allow"},
		}},
		{name: "registry config passed in, not there", cfg: func(c *Config) { c.RegistryConfig = "/etc/regs" }, rows: []want{
			{AreaInput, "registry config", Missing, true, "mkdir -p /etc/regs"},
		}},
		{name: "registry config passed in, there", host: func(h *Host) { h.RegistryConfigDir = true }, cfg: func(c *Config) { c.RegistryConfig = "/etc/regs" }, ready: true, rows: []want{
			{AreaInput, "registry config", Holds, false, ""},
		}},
		{name: "empty host", host: func(h *Host) { *h = Host{EUID: 1000} }, rows: []want{
			{AreaDeno, "unshare", Missing, true, "apt-get install -y util-linux"},
			{AreaNodes, "runc", Missing, true, "apt-get install -y runc"},
			{AreaNodes, "mkfs.ext4", Missing, true, "apt-get install -y e2fsprogs"},
			{AreaNodes, "unshare", Missing, true, "apt-get install -y util-linux"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, c := fullHost(), upDefaults()
			if tc.host != nil {
				tc.host(&h)
			}
			if tc.cfg != nil {
				tc.cfg(&c)
			}
			rows := Check(h, c)
			for _, w := range tc.rows {
				r := find(t, rows, w.area, w.req)
				if r.Status != w.status || r.Needed != w.needed || !strings.Contains(r.Fix, w.fix) || (w.fix == "" && r.Fix != "") {
					t.Errorf("%s / %s: got %s needed=%v fix %q (%s), want %s needed=%v fix containing %q",
						w.area, w.req, r.Status, r.Needed, r.Fix, r.Detail, w.status, w.needed, w.fix)
				}
			}
			if got := Ready(rows); got != tc.ready {
				t.Errorf("Ready = %v, want %v; blocking: %v", got, tc.ready, Err(rows))
			}
			err := Err(rows)
			var nr *NotReadyError
			if (err == nil) != tc.ready || (err != nil && !errors.As(err, &nr)) {
				t.Errorf("Err = %v, want nil iff ready", err)
			}
		})
	}
}

func TestSummary(t *testing.T) {
	h := fullHost()
	delete(h.Tools, "qemu-system-x86_64")
	c := upDefaults()
	c.NodeFlavour = FlavourVM
	lines := Summary(Check(h, c), c)
	want := map[string]string{
		AreaDeno:    "deno guests: ready",
		AreaVM:      "vm guests: missing qemu-system-x86_64 (apt-get install -y qemu-system-x86)",
		AreaVMNodes: "vm nodes: ready",
		AreaTenants: "tenant control planes: ready",
	}
	for area, w := range want {
		found := false
		for _, l := range lines {
			if strings.HasPrefix(l, area+":") {
				found = true
				if l != w {
					t.Errorf("summary of %s: %q, want %q", area, l, w)
				}
			}
		}
		if !found {
			t.Errorf("no summary line for %s in %q", area, lines)
		}
	}
	c.Deno = false
	for _, l := range Summary(Check(h, c), c) {
		if strings.HasPrefix(l, AreaDeno+":") && !strings.HasSuffix(l, "(not used by this configuration)") {
			t.Errorf("deno off: %q", l)
		}
	}
}

func TestValidate(t *testing.T) {
	err := Config{NodeFlavour: "bare"}.Validate()
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Flag != "--node-flavour" {
		t.Fatalf("Validate(bare) = %v, want a ConfigError on --node-flavour", err)
	}
	for _, f := range []string{"", FlavourNamespace, FlavourVM, FlavourAuto} {
		if err := (Config{NodeFlavour: f}).Validate(); err != nil {
			t.Errorf("Validate(%q) = %v", f, err)
		}
	}
}

// TestPrint: one line per row, aligned within an area, and the summary at the end.
func TestPrint(t *testing.T) {
	h, c := fullHost(), upDefaults()
	h.Deno = Deno{}
	var b strings.Builder
	if err := Print(&b, h, c, Check(h, c)); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, s := range []string{
		"host: kernel 6.18.0, euid 0, cgroups v2, /dev/kvm usable",
		"\ndeno guests\n",
		"  MISSING            needed    deno  ",
		"-> socialweb install-deps",
		"\ndeno guests: missing deno (socialweb install-deps",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}

func TestPackages(t *testing.T) {
	for _, tc := range []struct {
		name     string
		host     func(*Host)
		cfg      func(*Config)
		optional bool
		want     []string
	}{
		{name: "everything holds", want: nil},
		{name: "missing tools of a needed area, each package once", host: func(h *Host) {
			delete(h.Tools, "nsenter")
			delete(h.Tools, "setpriv")
			delete(h.Tools, "nft")
		}, want: []string{"nftables", "util-linux"}},
		{name: "missing files", host: func(h *Host) { h.Files[CNIBinDir+"/bridge"] = false }, want: []string{"containernetworking-plugins"}},
		{name: "namespace nodes make their disks with mkfs.ext4", host: func(h *Host) { delete(h.Tools, "mkfs.ext4") },
			cfg: func(c *Config) { c.NodeFlavour = FlavourNamespace }, want: []string{"e2fsprogs"}},
		{name: "an area the configuration does not run is left alone", host: func(h *Host) {
			delete(h.Tools, "qemu-system-x86_64")
		}, want: nil},
		{name: "namespace nodes on the node runtime need no host runc", host: func(h *Host) { delete(h.Tools, "runc") },
			cfg: func(c *Config) { c.NodeFlavour = FlavourNamespace }, want: nil},
		{name: "unless optional ones are asked for", host: func(h *Host) { delete(h.Tools, "runc") },
			cfg: func(c *Config) { c.NodeFlavour = FlavourNamespace }, optional: true, want: []string{"runc"}},
		{name: "deno comes from no package", host: func(h *Host) { h.Deno = Deno{} }, want: nil},
		{name: "tenants off: their tools are not installed", host: func(h *Host) { delete(h.Tools, "nsenter") },
			cfg: func(c *Config) { c.Tenants = false }, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, c := fullHost(), upDefaults()
			if tc.host != nil {
				tc.host(&h)
			}
			if tc.cfg != nil {
				tc.cfg(&c)
			}
			got := Packages(Check(h, c), tc.optional)
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("Packages = %v, want %v", got, tc.want)
			}
		})
	}
}
