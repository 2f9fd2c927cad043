// Package hostcheck says what this host can and cannot run: every requirement of every
// substrate (deno guests, vm guests, nodes of tenant clusters in a network namespace or in a
// microVM) and of the tenant control planes, as HOLDS, MISSING (with the command that
// installs it) or MUST BE PASSED IN (a flag or file only the operator can supply).
//
// Probe reads the real host once into a Host; Check is a pure function of a Host and the
// Config `up` (or `socialweb check-host`) would run with. `socialweb check-host` prints every
// row and exits non-zero when a row the configuration needs does not hold; `up` prints the
// one-line summary per area at start.
package hostcheck

import (
	"fmt"
	"slices"
	"strings"
)

// Status is what a requirement is on this host.
type Status string

const (
	// Holds: the host has it.
	Holds Status = "HOLDS"
	// Missing: the host lacks it; Row.Fix is the command that installs it.
	Missing Status = "MISSING"
	// MustBePassedIn: only the operator can supply it (a flag, a file, a directory);
	// Row.Fix names the flag.
	MustBePassedIn Status = "MUST BE PASSED IN"
)

// Areas of the rows, in the order they are printed.
const (
	AreaDeno    = "deno guests"
	AreaVM      = "vm guests"
	AreaNodes   = "nodes"
	AreaVMNodes = "vm nodes"
	AreaTenants = "tenant control planes"
	AreaInput   = "operator input"
)

// Areas lists every area in print order.
var Areas = []string{AreaDeno, AreaVM, AreaNodes, AreaVMNodes, AreaTenants, AreaInput}

// Node flavours, as node.FlavourNamespace, FlavourVM and FlavourAuto (the node package is
// not imported here: it brings the kubelet).
const (
	FlavourNamespace = "namespace"
	FlavourVM        = "vm"
	FlavourAuto      = "auto"
)

// HostRuntime is node.HostRuntime: --node-runtime host, the host's containerd and runc.
const HostRuntime = "host"

// Row is one requirement of one area.
type Row struct {
	Area        string
	Requirement string
	Status      Status
	// Detail says what was found (a path, a version, why not).
	Detail string
	// Fix is the exact command that installs a Missing requirement, or the flag that passes
	// a MustBePassedIn one in; "" for a row that holds.
	Fix string
	// Package is the Debian package that installs a Missing requirement (what
	// `socialweb install-deps` installs); "" when no package does.
	Package string
	// Optional: the area runs without it (it adds something: pods in user namespaces, KVM
	// speed, a private registry).
	Optional bool
	// Needed: the chosen configuration needs it (its area is enabled and it is not
	// optional). A needed row that does not hold makes the host not ready.
	Needed bool
}

// Blocking is a row the configuration needs that does not hold.
func (r Row) Blocking() bool { return r.Needed && r.Status != Holds }

// Config is what would run on this host: the flags of `up` that decide what the host needs.
type Config struct {
	// Deno: the deno bidder runs (up runs one).
	Deno bool
	// Tenants: tenant control planes run, and with them the local node bidder.
	Tenants bool
	// NodeFlavour is namespace, vm or auto ("" is auto).
	NodeFlavour string
	// VMImage is the vm image directory (up's --vm-image).
	VMImage string
	// NodeRuntime is up's --node-runtime: "" (node-runtime beside the binary, else the
	// host's), "host", or a directory.
	NodeRuntime string
	// RegistryConfig is up's --node-registry-config ("" none passed in).
	RegistryConfig string
	// TenantAdvertise is up's --tenant-advertise-address ("" socialweb makes 10.77.0.1).
	TenantAdvertise string
	// EgressAllow is up's --node-egress-allow.
	EgressAllow []string
}

// ConfigError is a Config value Check cannot decide on; Flag is the flag to change.
type ConfigError struct {
	Flag, Value, Want string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%s %q: want %s", e.Flag, e.Value, e.Want)
}

// Validate refuses a Config with a value no host can satisfy.
func (c Config) Validate() error {
	switch c.NodeFlavour {
	case "", FlavourNamespace, FlavourVM, FlavourAuto:
	default:
		return &ConfigError{Flag: "--node-flavour", Value: c.NodeFlavour, Want: "namespace, vm or auto"}
	}
	return nil
}

// flavour is the node flavour, "" meaning auto.
func (c Config) flavour() string {
	if c.NodeFlavour == "" {
		return FlavourAuto
	}
	return c.NodeFlavour
}

// Tool is a program looked up on PATH, and what installs it.
type Tool struct {
	Name    string
	Package string // the Debian package
	Why     string
}

// Install is the command that installs a Debian package.
func Install(pkg string) string { return "apt-get install -y " + pkg }

// Tools of each area, looked up on PATH (Probe looks up every one of AllTools).
var (
	denoTools = []Tool{{"unshare", "util-linux", "enters the jail's namespaces"}}
	// nodeTools are node.Prerequisites' programs, and nft for NetworkPolicy.
	nodeTools = []Tool{
		{"ip", "iproute2", "the node's network namespace and veth pair"},
		{"nsenter", "util-linux", "enters the node's namespaces"},
		{"setpriv", "util-linux", "drops the node's privileges"},
		{"iptables", "iptables", "the host refuses connections a node opens; kube-proxy"},
		{"nft", "nftables", "writes each node's NetworkPolicy rules"},
		{"mkfs.ext4", "e2fsprogs", "makes each node's disk"},
		{"unshare", "util-linux", "gives each node's agent the mount namespace of its disk"},
	}
	// hostRuntimeTools are the host's containerd and runc: node.Prerequisites asks for them
	// when nodes run on them (no node runtime dir, or vm nodes, whose root disk carries
	// them).
	hostRuntimeTools = []Tool{
		{"containerd", "containerd", "the node's container runtime"},
		{"containerd-shim-runc-v2", "containerd", "the runtime's shim"},
		{"runc", "runc", "runs the node's containers"},
		{"ctr", "containerd", "imports the node's images"},
	}
	vmTools     = []Tool{{"qemu-system-x86_64", "qemu-system-x86", "the microVM"}}
	vmNodeTools = []Tool{{"mkfs.ext4", "e2fsprogs", "writes the disks of vm nodes"}}
	// imageTools are what `socialweb image build` calls (image.Prerequisites).
	imageTools = []Tool{
		{"apt-get", "apt", "downloads the kernel and busybox packages"},
		{"apt-cache", "apt", "resolves the kernel package"},
		{"dpkg-deb", "dpkg", "unpacks them"},
	}
	tenantTools = []Tool{{"ip", "iproute2", "the tenants' network namespace and veth pair"}}
)

// AllTools are every program some row looks up.
func AllTools() []string {
	var names []string
	for _, list := range [][]Tool{denoTools, nodeTools, hostRuntimeTools, vmTools, vmNodeTools, imageTools, tenantTools} {
		for _, t := range list {
			if !slices.Contains(names, t.Name) {
				names = append(names, t.Name)
			}
		}
	}
	return names
}

// File is a file at a fixed path, and what installs it.
type File struct {
	Path    string
	Package string
	Why     string
}

// CNIBinDir and BusyboxStatic are node.CNIBinDir and node.BusyboxStatic.
const (
	CNIBinDir     = "/usr/lib/cni"
	BusyboxStatic = "/bin/busybox"
)

var nodeFiles = []File{
	{CNIBinDir + "/bridge", "containernetworking-plugins", "the node's pod bridge"},
	{CNIBinDir + "/host-local", "containernetworking-plugins", "pod addresses"},
	{CNIBinDir + "/loopback", "containernetworking-plugins", "pods' loopback"},
	{BusyboxStatic, "busybox-static", "the node's own root and local test image"},
}

// AllFiles are every fixed path some row stats.
func AllFiles() []string {
	var paths []string
	for _, f := range nodeFiles {
		paths = append(paths, f.Path)
	}
	return paths
}

// RuntimeBinaries are node.runtimeBinaries: what a node runtime directory holds.
var RuntimeBinaries = []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr"}

// RuntimeDirName is node.RuntimeDirName: the node runtime beside the binary.
const RuntimeDirName = "node-runtime"

// Check decides every row from host facts and the configuration; it reads nothing.
func Check(h Host, c Config) []Row {
	var rows []Row
	add := func(enabled bool, r Row) {
		r.Needed = enabled && !r.Optional
		if r.Status == Holds {
			r.Fix, r.Package = "", ""
		}
		rows = append(rows, r)
	}
	flavour := c.flavour()
	nodes := c.Tenants
	vmNodes := c.Tenants && flavour == FlavourVM

	// deno guests: the binary, root, and the jail's namespaces and cgroups.
	add(c.Deno, rootRow(AreaDeno, h, "jailed guests: namespaces, cgroups, a uid per guest"))
	if h.Deno.Path != "" {
		add(c.Deno, Row{Area: AreaDeno, Requirement: "deno", Status: Holds, Detail: h.Deno.Path + " (" + h.Deno.Where + ")"})
	} else {
		d := "not at $SOCIALWEB_DENO, in <module root>/.cache/deno, in the user's cache or on PATH"
		if h.Deno.Err != "" {
			d = h.Deno.Err
		}
		add(c.Deno, Row{Area: AreaDeno, Requirement: "deno", Status: Missing, Detail: d,
			Fix: "socialweb install-deps (up fetches it too: the pinned deno from the npm registry), or SOCIALWEB_DENO=PATH"})
	}
	for _, t := range denoTools {
		add(c.Deno, toolRow(AreaDeno, h, t))
	}
	add(c.Deno, namespacesRow(AreaDeno, h))
	add(c.Deno, cgroupRow(AreaDeno, h))

	// vm guests: qemu, an accelerator, the image (vm nodes boot them; no bidder runs bare
	// vm guests, so the area is needed only through vm nodes).
	for _, t := range vmTools {
		add(vmNodes, toolRow(AreaVM, h, t))
	}
	add(false, kvmRow(h))
	add(vmNodes, imageRow(h, c))
	for _, t := range imageTools {
		r := toolRow(AreaVM, h, t)
		r.Requirement += " (image build)"
		r.Optional = true
		add(vmNodes, r)
	}

	// nodes, whatever their flavour: node.Prerequisites, the runtime, nft.
	add(nodes, rootRow(AreaNodes, h, "network namespaces, mounts, containerd"))
	for _, t := range nodeTools {
		add(nodes, toolRow(AreaNodes, h, t))
	}
	onHostRuntime := c.NodeRuntime == HostRuntime || (c.NodeRuntime == "" && h.NodeRuntime.Missing != "") || flavour != FlavourNamespace
	for _, t := range hostRuntimeTools {
		r := toolRow(AreaNodes, h, t)
		if !onHostRuntime {
			r.Optional = true
			r.Detail += " (not used: namespace nodes run the node runtime's)"
		}
		add(nodes, r)
	}
	for _, f := range nodeFiles {
		add(nodes, fileRow(AreaNodes, h, f))
	}
	add(nodes, runtimeRow(h, c))
	if r, ok := userNamespacesRow(h, c); ok {
		add(nodes, r)
	}

	// vm nodes: the vm guests' rows above, mkfs.ext4, an image with the node modules.
	for _, t := range vmNodeTools {
		add(vmNodes, toolRow(AreaVMNodes, h, t))
	}
	add(vmNodes, nodeModulesRow(h, c))
	if flavour == FlavourAuto && c.Tenants {
		add(false, autoRow(h))
	}

	// tenant control planes: etcd and the apiserver run in-process; they need a
	// non-loopback address to advertise.
	add(c.Tenants, advertiseRow(h, c))

	// operator input: what only the operator can supply.
	add(nodes, registryRow(h, c))
	add(nodes, egressRow(c))
	add(false, Row{Area: AreaInput, Requirement: "account for `socialweb bidder`", Status: MustBePassedIn, Optional: true,
		Detail: "up bids from its own accounts on its embedded PDS; a bidder of its own bids from an account on any PDS",
		Fix:    "socialweb bidder --pds URL --identifier HANDLE --password-file FILE"})
	return rows
}

func rootRow(area string, h Host, why string) Row {
	r := Row{Area: area, Requirement: "root", Status: Holds, Detail: fmt.Sprintf("euid %d", h.EUID)}
	if h.EUID != 0 {
		r.Status, r.Detail, r.Fix = Missing, fmt.Sprintf("euid %d; %s need root", h.EUID, why), "run as root (sudo socialweb ...)"
	}
	return r
}

func toolRow(area string, h Host, t Tool) Row {
	if p := h.Tools[t.Name]; p != "" {
		return Row{Area: area, Requirement: t.Name, Status: Holds, Detail: p}
	}
	return Row{Area: area, Requirement: t.Name, Status: Missing, Detail: "not on PATH (" + t.Why + ")", Fix: Install(t.Package), Package: t.Package}
}

func fileRow(area string, h Host, f File) Row {
	if h.Files[f.Path] {
		return Row{Area: area, Requirement: f.Path, Status: Holds, Detail: f.Why}
	}
	return Row{Area: area, Requirement: f.Path, Status: Missing, Detail: "no such file (" + f.Why + ")", Fix: Install(f.Package), Package: f.Package}
}

func namespacesRow(area string, h Host) Row {
	var missing []string
	for _, ns := range []string{"mnt", "pid", "user"} {
		if !slices.Contains(h.Namespaces, ns) {
			missing = append(missing, ns)
		}
	}
	if len(missing) == 0 {
		return Row{Area: area, Requirement: "namespaces", Status: Holds, Detail: "mount, PID and user namespaces"}
	}
	return Row{Area: area, Requirement: "namespaces", Status: Missing,
		Detail: "the kernel has no " + strings.Join(missing, ", ") + " namespace (/proc/self/ns)",
		Fix:    "a kernel built with CONFIG_NAMESPACES (and its mount, PID and user namespaces)"}
}

func cgroupRow(area string, h Host) Row {
	if h.Cgroups.Err == "" {
		return Row{Area: area, Requirement: "cgroups", Status: Holds, Detail: h.Cgroups.Layout + ": memory, cpu, pids for the guests' limits"}
	}
	return Row{Area: area, Requirement: "cgroups", Status: Missing, Detail: h.Cgroups.Layout + ": " + h.Cgroups.Err,
		Fix: "mount cgroup2 with the memory, cpu and pids controllers at /sys/fs/cgroup (or their v1 hierarchies below it)"}
}

func kvmRow(h Host) Row {
	r := Row{Area: AreaVM, Requirement: "/dev/kvm", Optional: true}
	switch {
	case h.KVM.Usable:
		r.Status, r.Detail = Holds, "opens read-write; a test boot under kvm at start decides kvm or tcg"
	default:
		r.Status, r.Detail = Missing, "not usable ("+h.KVM.Err+"): guests run under tcg (emulation, slower)"
		r.Fix = "a host with hardware virtualisation (none: guests boot under tcg)"
	}
	return r
}

func imageRow(h Host, c Config) Row {
	r := Row{Area: AreaVM, Requirement: "vm image"}
	if h.VMImage.Present {
		r.Status, r.Detail = Holds, h.VMImage.Dir
		return r
	}
	r.Status, r.Detail = Missing, h.VMImage.Err
	if r.Detail == "" {
		r.Detail = "no image in " + h.VMImage.Dir
	}
	if h.Tools["apt-get"] == "" || h.Tools["dpkg-deb"] == "" {
		// No apt here: the image is built elsewhere and handed over.
		r.Status, r.Fix = MustBePassedIn, "--vm-image DIR (an image `socialweb image build` wrote on a Debian host)"
		return r
	}
	r.Fix = "socialweb image build --out " + h.VMImage.Dir
	return r
}

func nodeModulesRow(h Host, c Config) Row {
	r := Row{Area: AreaVMNodes, Requirement: "vm image with node modules"}
	switch {
	case !h.VMImage.Present:
		r.Status, r.Detail, r.Fix = Missing, "no vm image (see "+AreaVM+")", "socialweb image build --out "+h.VMImage.Dir
	case !h.VMImage.NodeModules:
		r.Status, r.Detail, r.Fix = Missing, "the image in "+h.VMImage.Dir+" predates the node modules", "socialweb image build --out "+h.VMImage.Dir
	default:
		r.Status, r.Detail = Holds, "bridge, veth, overlay, virtio_blk in the initramfs"
	}
	return r
}

// autoRow says what --node-flavour auto will choose, as far as a host without a test
// boot can tell.
func autoRow(h Host) Row {
	r := Row{Area: AreaVMNodes, Requirement: "--node-flavour auto", Status: Holds, Optional: true}
	switch {
	case h.Tools["qemu-system-x86_64"] == "" || !h.VMImage.Present || !h.VMImage.NodeModules || h.Tools["mkfs.ext4"] == "":
		r.Detail = "namespace nodes: vm nodes lack what the rows above say"
	case !h.KVM.Usable:
		r.Detail = "namespace nodes: no usable /dev/kvm (vm nodes only under kvm)"
	default:
		r.Detail = "vm nodes if a test boot under kvm succeeds at start, else namespace nodes"
	}
	return r
}

func runtimeRow(h Host, c Config) Row {
	r := Row{Area: AreaNodes, Requirement: "node runtime", Status: Holds}
	switch {
	case c.NodeRuntime == HostRuntime:
		r.Detail = "--node-runtime host: the host's containerd and runc"
	case c.NodeRuntime != "":
		if h.NodeRuntime.Missing != "" {
			r.Status = Missing
			r.Detail = fmt.Sprintf("--node-runtime %s has no %s", h.NodeRuntime.Dir, h.NodeRuntime.Missing)
			r.Fix = "bash hack/build-node-runtime.sh " + h.NodeRuntime.Dir + " (needs " + Install("libseccomp-dev") + ")"
		} else {
			r.Detail = h.NodeRuntime.Dir + " (--node-runtime)"
		}
	case h.NodeRuntime.Missing == "":
		r.Detail = h.NodeRuntime.Dir + " (beside the binary)"
	default:
		r.Detail = "the host's containerd and runc (" + h.NodeRuntime.Dir + " has no " + h.NodeRuntime.Missing + ")"
	}
	return r
}

// userNamespacesRow: pods with hostUsers: false need the node runtime (containerd v2,
// runc from source); the host's Debian ones cannot run them.
func userNamespacesRow(h Host, c Config) (Row, bool) {
	if c.NodeRuntime != "" && c.NodeRuntime != HostRuntime {
		return Row{}, false // the runtime row says it all
	}
	r := Row{Area: AreaNodes, Requirement: "pods with hostUsers: false", Optional: true}
	if c.NodeRuntime == "" && h.NodeRuntime.Missing == "" {
		r.Status, r.Detail = Holds, "the node runtime runs pods in user namespaces"
		return r, true
	}
	r.Status, r.Detail = Missing, "the host's containerd and runc cannot run pods in user namespaces"
	r.Fix = "bash hack/build.sh (builds bin/node-runtime beside bin/socialweb; needs " + Install("libseccomp-dev") + ")"
	return r, true
}

func advertiseRow(h Host, c Config) Row {
	r := Row{Area: AreaTenants, Requirement: "advertise address"}
	switch {
	case c.TenantAdvertise != "":
		if slices.Contains(h.Addresses, c.TenantAdvertise) {
			r.Status, r.Detail = Holds, c.TenantAdvertise+" (--tenant-advertise-address) is on an interface"
		} else {
			r.Status, r.Detail = MustBePassedIn, c.TenantAdvertise+" (--tenant-advertise-address) is on no interface of this host"
			r.Fix = "--tenant-advertise-address ADDR (a non-loopback address this host has)"
		}
	case slices.Contains(h.Addresses, TenantAdvertiseIP):
		r.Status, r.Detail = Holds, TenantAdvertiseIP+" is there (network namespace socialweb-tenants)"
	case h.EUID == 0 && h.Tools["ip"] != "":
		r.Status, r.Detail = Holds, "root and ip: socialweb makes "+TenantAdvertiseIP+" on a veth pair at start"
	default:
		why := "not root"
		if h.EUID == 0 {
			why = "no ip (iproute2)"
		}
		r.Status, r.Detail = MustBePassedIn, why+": socialweb cannot make "+TenantAdvertiseIP
		r.Fix = "--tenant-advertise-address ADDR, or run as root with " + Install("iproute2")
	}
	return r
}

// TenantAdvertiseIP is tenant.AdvertiseIP.
const TenantAdvertiseIP = "10.77.0.1"

func registryRow(h Host, c Config) Row {
	r := Row{Area: AreaInput, Requirement: "registry config", Optional: true}
	switch {
	case c.RegistryConfig == "":
		r.Status = MustBePassedIn
		r.Detail = "only for nodes pulling from a private registry or a mirror (docs/images.md); without it, public registries and image tarballs"
		r.Fix = "--node-registry-config DIR (HOST[:PORT]/hosts.toml)"
	case h.RegistryConfigDir:
		r.Status, r.Detail = Holds, c.RegistryConfig+" (--node-registry-config)"
	default:
		r.Status, r.Optional = Missing, false
		r.Detail = c.RegistryConfig + " (--node-registry-config) is not a directory"
		r.Fix = "mkdir -p " + c.RegistryConfig + " and write HOST[:PORT]/hosts.toml in it (docs/images.md)"
	}
	return r
}

func egressRow(c Config) Row {
	r := Row{Area: AreaInput, Requirement: "egress to a private network", Optional: true}
	if len(c.EgressAllow) > 0 {
		r.Status, r.Detail = Holds, strings.Join(c.EgressAllow, ",")+" (--node-egress-allow)"
		return r
	}
	r.Status = MustBePassedIn
	r.Detail = "pods reach no private range; only for a registry or DNS server on a private network"
	r.Fix = "--node-egress-allow CIDR (and --node-egress-deny CIDR for more denies)"
	return r
}

// Ready is false when a row the configuration needs does not hold.
func Ready(rows []Row) bool {
	return !slices.ContainsFunc(rows, Row.Blocking)
}

// NotReadyError lists the rows the configuration needs that do not hold.
type NotReadyError struct{ Rows []Row }

func (e *NotReadyError) Error() string {
	var parts []string
	for _, r := range e.Rows {
		parts = append(parts, fmt.Sprintf("%s: %s (%s)", r.Area, r.Requirement, r.Fix))
	}
	return fmt.Sprintf("this host lacks %d requirement(s) of the chosen configuration: %s", len(e.Rows), strings.Join(parts, "; "))
}

// Err is a *NotReadyError naming the blocking rows, or nil.
func Err(rows []Row) error {
	var blocking []Row
	for _, r := range rows {
		if r.Blocking() {
			blocking = append(blocking, r)
		}
	}
	if len(blocking) == 0 {
		return nil
	}
	return &NotReadyError{Rows: blocking}
}

// Packages are the Debian packages that install the rows that do not hold: those the
// configuration needs, and with optional also those it runs without. Sorted, each once.
func Packages(rows []Row, optional bool) []string {
	var pkgs []string
	for _, r := range rows {
		if r.Status == Holds || r.Package == "" || !(r.Needed || optional && r.Optional) {
			continue
		}
		if !slices.Contains(pkgs, r.Package) {
			pkgs = append(pkgs, r.Package)
		}
	}
	slices.Sort(pkgs)
	return pkgs
}
