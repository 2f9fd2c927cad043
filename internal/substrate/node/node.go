// Package node is the node substrate: a guest is a Kubernetes node of a tenant cluster run on
// the bidder host itself, for hosts without a usable hypervisor. Each node gets its own
// network namespace (a veth pair to the host), its own containerd (root, state, socket, runc
// root, CNI config and IPAM dirs of its own) and a kubelet (`socialweb kube kubelet`), both
// started inside the namespace, under one agent process (`socialweb node-agent DIR`) that
// forwards the tenant apiserver's port into the namespace, imports the images and tears
// everything down when stopped.
//
// The guest's userData is a JSON Join{Server, NodeName, Labels, Taints}; its secrets "kubeconfig" and "ca" are
// the join bundle Secret's keys of those names (internal/tenant.MintNodeBundle). See docs/substrates.md.
package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"socialweb.computer/internal/clusternet"
	"socialweb.computer/internal/nodedns"
	"socialweb.computer/internal/podnet"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/vm"
)

// Kind is this substrate's name.
const Kind = "node"

// Secret names a node guest needs: the join bundle Secret's keys of the same names
// (tenant.BundleKeyKubeconfig, tenant.BundleKeyCA; secret names take no dots).
const (
	SecretKubeconfig = "kubeconfig"
	SecretCA         = "ca"
)

// Files in a guest dir, beside guestproc's pid.json, exit, stopped and log.
const (
	guestFile  = "guest.json"
	nodeFile   = "node.json"
	secretsDir = "secrets"
	workDir    = "work" // containerd root, kubelet root, CNI config, pod logs: removed on Stop
)

// Join is the userData of a node guest.
type Join struct {
	// Server is the tenant apiserver as the bundle's kubeconfig names it:
	// https://127.0.0.1:PORT, the tenant gate on this host, or https://IP:PORT on another
	// host that the bidder's egress policy lets pods reach (checkJoinServer). The agent
	// listens on the same address inside the node and forwards to it from the host, so the
	// kubeconfig is used as is.
	Server string `json:"server"`
	// NodeName is the node's name (the bundle's certificate is for system:node:<NodeName>).
	NodeName string `json:"nodeName"`
	// Labels are set on the Node when it registers (the kubelet's --node-labels); none in
	// the kubernetes.io or k8s.io namespaces.
	Labels map[string]string `json:"labels,omitempty"`
	// Taints are set on the Node when it registers (the kubelet's registerWithTaints), each
	// as key[=value]:Effect, so no pod lands there before whoever asked lifts them.
	Taints []string `json:"taints,omitempty"`
}

// Config configures the substrate.
type Config struct {
	// StateDir holds one directory per node.
	StateDir string
	// Binary is the socialweb binary (it runs `node-agent` and `kube kubelet`); empty means
	// this process's executable.
	Binary string
	// RuntimeDir holds the node runtime: containerd, containerd-shim-runc-v2, runc and ctr
	// (hack/build-node-runtime.sh builds containerd v2 and runc, which run pods with
	// hostUsers: false). Empty: node-runtime beside Binary when it holds all four, else the
	// host's on PATH; HostRuntime: the host's.
	RuntimeDir string
	// ImageDir holds OCI image-layout tarballs (*.tar) imported into every node at boot;
	// pods use them with imagePullPolicy Never (or IfNotPresent). Empty: none but the
	// sandbox image.
	ImageDir string
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL (default 20s: the agent
	// stops the pods, the kubelet and containerd in order within it).
	StopGrace time.Duration
	// Flavour is FlavourNamespace (the default), FlavourVM or FlavourAuto (decided once, in
	// New: Substrate.Flavour says what it chose and why).
	Flavour string
	// RegistryConfigDir is how nodes reach image registries, in containerd's hosts
	// directory layout (docs/images.md): one directory per registry host (docker.io,
	// 203.0.113.5:5000, _default) holding a hosts.toml with its mirrors, CA, client
	// certificates and headers (credentials). Copied into every node at boot. Empty: pulls
	// go to each registry's own https endpoint with the host's CA bundle.
	RegistryConfigDir string
	// VMImageDir is the vm substrate's image (kernel and initramfs, `socialweb image build`)
	// that vm nodes boot.
	VMImageDir string
	// QEMU and Accelerator are as in vm.Config, for vm nodes.
	QEMU, Accelerator string
	// DNSUpstream is where nodes' DNS servers forward names outside their cluster: IP or
	// IP:port, comma-separated, nodedns.UpstreamNone, or empty for the first nameserver of
	// the host's /etc/resolv.conf that is not a loopback address (none if there is none).
	DNSUpstream string
	// Progress, when set, hears of a FlavourAuto decision that takes more than a second (the
	// accelerator probe's test boot, once per host boot).
	Progress func(format string, args ...any)
	// EgressAllow and EgressDeny are the operator's changes to what pods may reach beyond
	// their cluster (podnet.ParseEgressPolicy: CIDRs; the deny list is podnet.DefaultDeny
	// plus EgressDeny, and EgressAllow opens holes in it).
	EgressAllow, EgressDeny []string
	// OverlayAddress, when set, is this host's public IPv4 address as other hosts reach it:
	// each namespace node then publishes an overlay endpoint of that address and a port of
	// OverlayPorts the host forwards to it (podnet.Host.PublishOverlay), so nodes of a
	// cluster rented on other hosts can be its peers. Empty: nodes publish their link
	// address, which only this host reaches.
	OverlayAddress string
	// LocalGateAddress, when set, is this host's public IPv4 address where its own tenant
	// gates listen (up --tenant-address): a Join naming it is a control plane on this host,
	// taken as 127.0.0.1 is, although it is one of the host's addresses.
	LocalGateAddress string
	// OverlayPorts is the host's UDP ports for those endpoints, FIRST-LAST (empty:
	// podnet.DefaultOverlayPorts).
	OverlayPorts string
	// DiskMiB is the disk of a namespace node whose contract names none (0: DefaultDiskMiB).
	DiskMiB int
	// Uncontained boots namespace nodes as they ran before containment: containerd and the
	// kubelet in the host's mount and PID namespaces (only the network namespace is the
	// node's), with no cgroup limits. It is the baseline containment's cost is measured
	// against (the node containment benchmark); no command of socialweb sets it, and a
	// container that escapes such a node is on the host.
	Uncontained bool
}

// Substrate runs nodes.
type Substrate struct {
	cfg    Config
	egress podnet.EgressPolicy
	// overlayPublic, overlayPorts: Config.OverlayAddress and OverlayPorts, parsed.
	overlayPublic netip.Addr
	overlayPorts  podnet.PortRange
	store         guestproc.Store
	vm            *vm.Substrate // FlavourVM: the machine's image, accelerator and command line
	why           string        // why this flavour
	// dnsUpstreams, dnsWhy: Config.DNSUpstream decided once, in New.
	dnsUpstreams []string
	dnsWhy       string
	runtime      nodeRuntime // where namespace nodes' containerd and runc are, and why
	rootFiles    rootFilesCache
	unshare      string     // util-linux unshare(1): the agent's own mount namespace (disk.go)
	mu           sync.Mutex // guards address allocation
}

// Runtime is the dir of the namespace nodes' containerd and runc (empty: the host's on
// PATH), and why; userns says whether their pods may run with hostUsers: false.
func (s *Substrate) Runtime() (dir, why string, userns bool) {
	return s.runtime.Dir, s.runtime.Why, s.runtime.UserNamespaces()
}

// Flavour is the flavour of the nodes this substrate boots, and why.
func (s *Substrate) Flavour() (flavour, reason string) { return s.cfg.Flavour, s.why }

var _ substrate.Substrate = (*Substrate)(nil)

// New checks the host: root, iproute2, nsenter, containerd, runc, ctr, the CNI plugins and
// busybox-static; anything missing is ErrUnavailable naming what to install.
func New(cfg Config) (*Substrate, error) {
	if cfg.StateDir == "" {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrInvalidSpec, "StateDir is empty")
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = 20 * time.Second
	}
	if cfg.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, substrate.Errorf(Kind, "new", "", substrate.ErrUnavailable, "socialweb binary: %v", err)
		}
		cfg.Binary = exe
	}
	switch cfg.Flavour {
	case "":
		cfg.Flavour = FlavourNamespace
	case FlavourNamespace, FlavourVM, FlavourAuto:
	default:
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrInvalidSpec, "flavour %q: want %s, %s or %s", cfg.Flavour, FlavourNamespace, FlavourVM, FlavourAuto)
	}
	egress, err := podnet.ParseEgressPolicy(cfg.EgressAllow, cfg.EgressDeny)
	if err != nil {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrInvalidSpec, "%v", err)
	}
	overlayPublic, overlayPorts, err := parseOverlay(cfg.OverlayAddress, cfg.OverlayPorts)
	if err != nil {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrInvalidSpec, "%v", err)
	}
	if _, err := diskMiB(0, cfg.DiskMiB); err != nil {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrInvalidSpec, "node disk: %v", err)
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	cfg.StateDir = abs
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, err
	}
	rt, err := chooseRuntime(cfg.RuntimeDir, cfg.Binary)
	if err != nil {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrUnavailable, "%v", err)
	}
	// A vm node's root disk carries the host's containerd and runc; a namespace node with a
	// node runtime dir needs none of the host's.
	if err := prerequisites(rt.Dir == "" || cfg.Flavour != FlavourNamespace); err != nil {
		return nil, &substrate.Error{Kind: Kind, Op: "new", Err: err}
	}
	unsharePath, err := exec.LookPath("unshare")
	if err != nil {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrUnavailable, "unshare (util-linux): %v", err)
	}
	s := &Substrate{cfg: cfg, egress: egress, overlayPublic: overlayPublic, overlayPorts: overlayPorts,
		store: guestproc.Store{Root: abs}, why: "configured", runtime: rt, unshare: unsharePath}
	resolvConf, _ := os.ReadFile("/etc/resolv.conf")
	if s.dnsUpstreams, s.dnsWhy, err = nodedns.ChooseUpstreams(cfg.DNSUpstream, resolvConf); err != nil {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrInvalidSpec, "DNS upstream: %v", err)
	}
	switch cfg.Flavour {
	case FlavourVM:
		if s.vm, err = newVM(cfg); err != nil {
			return nil, &substrate.Error{Kind: Kind, Op: "new", Err: err}
		}
	case FlavourAuto:
		v, verr := newVM(cfg)
		var accel, why string
		if verr == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			slow := time.AfterFunc(time.Second, func() {
				if cfg.Progress != nil {
					cfg.Progress("choosing the node flavour: a test boot under kvm (once per host boot)")
				}
			})
			accel, verr = v.Accelerator(ctx)
			slow.Stop()
			why = v.AcceleratorReason(ctx)
			cancel()
		}
		s.cfg.Flavour, s.why = chooseFlavour(verr, accel, why)
		if s.cfg.Flavour == FlavourVM {
			s.vm = v
		}
	}
	return s, nil
}

// CNIBinDir is where Debian's containernetworking-plugins puts bridge, host-local, loopback.
const CNIBinDir = "/usr/lib/cni"

// Prerequisites reports what this host lacks to run nodes on its own containerd and runc
// (ErrUnavailable), or nil.
func Prerequisites() error { return prerequisites(true) }

// prerequisites is Prerequisites, with the host's containerd, shim, runc and ctr on PATH
// required only when hostRuntime.
func prerequisites(hostRuntime bool) error {
	var missing []string
	tools := []string{"ip", "nsenter", "setpriv", "iptables", "mkfs.ext4", "unshare"}
	if hostRuntime {
		tools = append(tools, runtimeBinaries...)
	}
	for _, b := range tools {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	for _, p := range []string{CNIBinDir + "/bridge", CNIBinDir + "/host-local", CNIBinDir + "/loopback", BusyboxStatic} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: missing %s: run hack/install-guest-deps.sh (Debian containerd, runc, containernetworking-plugins, busybox-static, iptables, e2fsprogs; iproute2 and util-linux)",
			substrate.ErrUnavailable, strings.Join(missing, ", "))
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: the node substrate needs root (network namespaces, mounts, containerd)", substrate.ErrUnavailable)
	}
	return nil
}

// Kind implements substrate.Substrate.
func (s *Substrate) Kind() string { return Kind }

// nodeState is node.json: everything the agent needs, written by Boot.
type nodeState struct {
	NodeName  string `json:"nodeName"`
	Server    string `json:"server"`
	Index     int    `json:"index"`               // the node's /30 in 10.78.0.0/16: 10.78.<i/64>.<(i%64)*4>
	Netns     string `json:"netns"`               // name under /run/netns
	HostLink  string `json:"hostLink"`            // host end of the veth pair
	HostIP    string `json:"hostIP"`              // host end's address
	NodeIP    string `json:"nodeIP"`              // the namespace end: the node's InternalIP
	RunDir    string `json:"runDir"`              // short path for sockets and containerd state
	Dir       string `json:"dir"`                 // the guest dir
	Binary    string `json:"binary"`              // socialweb
	ImageDir  string `json:"imageDir"`            // user images
	PauseTar  string `json:"pauseTar"`            // the sandbox image tarball
	PodSubnet string `json:"podSubnet,omitempty"` // a node booted with a fixed bridge subnet; now the Node's spec.podCIDR
	Cgroup    string `json:"cgroup"`              // the name of the node's cgroup in each hierarchy
	// Runtime is where the node's containerd and runc are (empty: the host's on PATH).
	Runtime nodeRuntime `json:"runtime,omitempty"`

	// DNSUpstreams get the names outside the cluster from the node's DNS server (none:
	// SERVFAIL); DNSUpstreamWhy says where they came from, for the agent's log.
	DNSUpstreams   []string `json:"dnsUpstreams,omitempty"`
	DNSUpstreamWhy string   `json:"dnsUpstreamWhy,omitempty"`
	// Registry is Config.RegistryConfigDir, copied into the node at its start.
	Registry string `json:"registry,omitempty"`

	// Contained: containerd and the kubelet run in the node's own mount, PID, IPC, UTS and
	// cgroup namespaces under its own root (contain.go), and its cgroups carry CPUs and
	// MemMiB, the contract's. False for a node booted before containment (its teardown is
	// the one it was booted with) and for the vm flavour (the machine is the boundary).
	Contained bool `json:"contained,omitempty"`
	// Root is what a contained node's root is made of, resolved by the substrate (once per
	// binary and runtime, not per boot); empty for a node booted before it (process 1
	// resolves it then).
	Root   *rootFiles `json:"root,omitempty"`
	CPUs   int        `json:"cpus,omitempty"`
	MemMiB int        `json:"memMiB,omitempty"`
	// CNIGate is the CNI plugin that holds each new pod until the node's NetworkPolicy
	// rules know its addresses (podgate: the small socialweb-cni-netpol beside Binary, else
	// Binary under its name); empty for a node booted before it and for the vm flavour.
	CNIGate string `json:"cniGate,omitempty"`
	// Labels and Taints are the Join's, for the kubelet to register the Node with.
	Labels map[string]string `json:"labels,omitempty"`
	Taints []corev1.Taint    `json:"taints,omitempty"`

	// PodNet: the node's pod network is the cluster's (its Node's spec.podCIDR, the
	// overlay, egress through the host's chains; docs/networking.md), with the bidder's
	// egress policy at boot. False for a node booted before it.
	PodNet      bool     `json:"podNet,omitempty"`
	EgressAllow []string `json:"egressAllow,omitempty"`
	// OverlayEndpoint is the overlay endpoint the host forwards to this node (its public
	// address and a port of its own), published on the Node instead of NodeIP's; empty when
	// the bidder publishes none.
	OverlayEndpoint string `json:"overlayEndpoint,omitempty"`
	// DiskMiB is the size of a namespace node's disk (disk.go), its work dir.
	DiskMiB    int      `json:"diskMiB,omitempty"`
	EgressDeny []string `json:"egressDeny,omitempty"`

	// FlavourVM. On the host: the namespace's bridge address, where the guest finds the
	// apiserver port, and the machine. In the guest (its node.json on the state disk):
	// Upstream, the bridge's address and port the agent forwards the apiserver port to,
	// and Console, logs copied to the serial console. A guest's Netns is empty.
	Flavour     string   `json:"flavour,omitempty"`
	BridgeIP    string   `json:"bridgeIP,omitempty"`
	QEMUArgv    []string `json:"qemuArgv,omitempty"`
	Accelerator string   `json:"accelerator,omitempty"`
	Upstream    string   `json:"upstream,omitempty"`
	Console     bool     `json:"console,omitempty"`
}

type guestState struct {
	Spec      substrate.GuestSpec `json:"spec"`
	Node      nodeState           `json:"node"`
	Argv      []string            `json:"argv"`
	StartedAt time.Time           `json:"startedAt"`
}

const maxNodes = 4096

func addrs(i int) (host, node string) {
	b := 4 * i
	return fmt.Sprintf("10.78.%d.%d", b/256, b%256+1), fmt.Sprintf("10.78.%d.%d", b/256, b%256+2)
}

// Boot implements substrate.Substrate: it validates, makes the network namespace and the
// veth pair, and starts the agent; the node registers on its own afterwards (Running means
// the agent runs; the node's readiness is the tenant cluster's to report).
func (s *Substrate) Boot(ctx context.Context, spec substrate.GuestSpec) (substrate.GuestStatus, error) {
	fail := func(sentinel error, format string, args ...any) (substrate.GuestStatus, error) {
		return substrate.GuestStatus{}, substrate.Errorf(Kind, "boot", spec.ID, sentinel, format, args...)
	}
	if err := spec.Validate(); err != nil {
		return fail(substrate.ErrInvalidSpec, "%v", err)
	}
	if !spec.Permissions.IsZero() || len(spec.Ports) > 0 {
		return fail(substrate.ErrInvalidSpec, "a node takes no permissions and no ports (its pods' traffic stays in its network namespace)")
	}
	var j Join
	if err := json.Unmarshal(spec.UserData, &j); err != nil {
		return fail(substrate.ErrInvalidSpec, "userData must be JSON {server, nodeName}: %v", err)
	}
	if _, err := checkJoinServer(j.Server, s.egress, hostAddrs(), s.cfg.LocalGateAddress); err != nil {
		return fail(substrate.ErrInvalidSpec, "%v", err)
	}
	if !nodeNameRE(j.NodeName) {
		return fail(substrate.ErrInvalidSpec, "nodeName %q: want a DNS-1123 subdomain", j.NodeName)
	}
	taints, err := j.registerTaints()
	if err != nil {
		return fail(substrate.ErrInvalidSpec, "%v", err)
	}
	if err := j.validateLabels(); err != nil {
		return fail(substrate.ErrInvalidSpec, "%v", err)
	}
	for _, k := range []string{SecretKubeconfig, SecretCA} {
		if len(spec.Secrets[k]) == 0 {
			return fail(substrate.ErrInvalidSpec, "secret %s missing (the join bundle's kubeconfig and ca)", k)
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	dir, err := s.store.Create(spec.ID)
	if errors.Is(err, os.ErrExist) {
		return fail(substrate.ErrExists, "")
	}
	if err != nil {
		return fail(substrate.ErrBoot, "%v", err)
	}
	booted := false
	// ns is the node as far as it was made: a boot that fails before its node.json is
	// written (making its disk, publishing its overlay endpoint, or writing node.json) still
	// removes its disk image and its host rules.
	var ns nodeState
	defer func() {
		if !booted {
			_ = teardownHost(ns)
			_ = os.RemoveAll(dir)
		}
	}()

	unlockAddresses, err := lockAddresses()
	if err != nil {
		return fail(substrate.ErrBoot, "%v", err)
	}
	// Released once the block's address is on the host end of the node's link (below), or
	// when Boot fails before that.
	addressesHeld := true
	defer func() {
		if addressesHeld {
			unlockAddresses()
		}
	}()
	idx, err := s.freeIndex(spec.ID)
	if err != nil {
		return fail(substrate.ErrBoot, "%v", err)
	}
	hostIP, nodeIP := addrs(idx)
	h := sha256.Sum256([]byte(dir))
	tag := hex.EncodeToString(h[:])[:10]
	ns = nodeState{
		NodeName: j.NodeName, Server: j.Server, Index: idx, Labels: j.Labels, Taints: taints,
		Netns: "swnode-" + tag, HostLink: "swn" + tag, HostIP: hostIP, NodeIP: nodeIP,
		RunDir: "/run/swnode/" + tag, Dir: dir, Binary: s.cfg.Binary, Runtime: s.runtime, ImageDir: s.cfg.ImageDir, Registry: s.cfg.RegistryConfigDir,
		PauseTar:  filepath.Join(s.cfg.StateDir, ".images", "pause.tar"),
		Cgroup:    "socialweb-node-" + tag,
		Contained: !s.cfg.Uncontained, CPUs: spec.CPUs, MemMiB: spec.MemMiB,
		PodNet:       true,
		DNSUpstreams: s.dnsUpstreams, DNSUpstreamWhy: s.dnsWhy,
	}
	ns.EgressAllow, ns.EgressDeny = s.egress.Strings()
	if err := os.MkdirAll(filepath.Dir(ns.PauseTar), 0o700); err != nil {
		return fail(substrate.ErrBoot, "%v", err)
	}
	if _, err := os.Stat(ns.PauseTar); err != nil {
		if err := WritePauseImage(ns.PauseTar); err != nil {
			return fail(substrate.ErrUnavailable, "sandbox image: %v", err)
		}
	}
	if s.cfg.Flavour == FlavourVM {
		// The machine's own run dir, runc root and cgroups are inside it, and so are the
		// secrets: on its state disk, never in the guest dir on the host.
		ns.Flavour, ns.RunDir, ns.Cgroup, ns.Contained = FlavourVM, "", "", false
		ns.HostIP, ns.NodeIP, ns.BridgeIP = vmAddrs(idx)
		if err := s.prepareVM(ctx, &ns, spec); err != nil {
			return fail(substrate.ErrBoot, "%v", err)
		}
	} else if reason, err := s.prepareNamespace(&ns, spec); err != nil {
		return fail(reason, "%v", err)
	}
	if err := guestproc.WriteJSON(filepath.Join(dir, nodeFile), ns); err != nil {
		return fail(substrate.ErrBoot, "%v", err)
	}
	setup := setupNetwork
	if ns.Flavour == FlavourVM {
		setup = setupVMNetwork
	}
	err = setup(ns)
	addressesHeld = false
	unlockAddresses()
	if err != nil {
		return fail(substrate.ErrBoot, "network namespace: %v", err)
	}
	argv := []string{s.cfg.Binary, "node-agent", dir}
	if ns.DiskMiB > 0 {
		// The agent mounts the node's disk in a mount namespace of its own (disk.go).
		argv = append([]string{s.unshare, "--mount", "--propagation", "slave", "--"}, argv...)
	}
	gs := guestState{Spec: spec, Node: ns, Argv: argv, StartedAt: time.Now().UTC()}
	gs.Spec.UserData, gs.Spec.Secrets = nil, nil
	if err := guestproc.WriteJSON(filepath.Join(dir, guestFile), gs); err != nil {
		return fail(substrate.ErrBoot, "%v", err)
	}
	rec, err := guestproc.Start(guestproc.StartOptions{
		Dir: dir, Argv: argv, Cwd: dir, Cleanup: []string{secretsDir},
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + dir},
	})
	if err != nil {
		return fail(substrate.ErrBoot, "%v", err)
	}
	booted = true
	return s.status(spec.ID, dir, gs, rec), nil
}

// writeSecrets writes one file per secret (mode 0400) into the new dir d (mode 0700).
func writeSecrets(d string, secrets map[string][]byte) error {
	if err := os.Mkdir(d, 0o700); err != nil {
		return err
	}
	for k, v := range secrets {
		if err := os.WriteFile(filepath.Join(d, k), v, 0o400); err != nil {
			return err
		}
	}
	return nil
}

func nodeStateFor(dir string) nodeState {
	var ns nodeState
	_ = guestproc.ReadJSON(filepath.Join(dir, nodeFile), &ns)
	return ns
}

func nodeNameRE(n string) bool {
	if n == "" || len(n) > 253 {
		return false
	}
	for i, c := range n {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || (c == '-' || c == '.') && i > 0 && i < len(n)-1
		if !ok {
			return false
		}
	}
	return true
}

// freeIndex picks the lowest address block no other node of this state dir holds.
func (s *Substrate) freeIndex(self string) (int, error) {
	ids, err := s.store.IDs()
	if err != nil {
		return 0, err
	}
	used := map[int]bool{}
	for _, id := range ids {
		if id == self {
			continue
		}
		var ns nodeState
		if guestproc.ReadJSON(filepath.Join(s.store.Dir(id), nodeFile), &ns) == nil {
			used[ns.Index] = true
		}
	}
	// Another state dir on this host (a second bidder, a test) allocates from the same
	// range: an address some interface of the host already holds is taken too, or the
	// apiserver of one node's cluster would reach the other's kubelet.
	onHost := map[string]bool{}
	if as, err := net.InterfaceAddrs(); err == nil {
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				onHost[n.IP.String()] = true
			}
		}
	}
	for _, i := range indexOrder(self) {
		h, _ := addrs(i)
		vh, _, _ := vmAddrs(i)
		if !used[i] && !onHost[h] && !onHost[vh] {
			return i, nil
		}
	}
	return 0, fmt.Errorf("no free node address: %d nodes in this state dir", maxNodes)
}

// indexOrder is the order in which a node tries the address blocks: every block 1 to
// maxNodes-1 once, starting at one drawn from the node's ID rather than at the lowest. Every
// host plans its node links from the same range, so nodes of one cluster rented on
// different hosts would otherwise all be 10.78.0.2; the apiserver's tunnel refuses to guess
// between two nodes with one address (tunnel.ErrSharedAddress), and with blocks spread over
// the range two nodes of a cluster share one about once in maxNodes pairs.
func indexOrder(id string) []int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	n := maxNodes - 1
	start := int(h.Sum32() % uint32(n))
	order := make([]int, n)
	for k := range order {
		order[k] = 1 + (start+k)%n
	}
	return order
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setupNetwork makes the namespace and the veth pair: host end HostIP/30, namespace end
// (eth0) NodeIP/30 with the host end as its default route, lo up.
func setupNetwork(ns nodeState) error {
	if err := makeNamespace(ns, "/30",
		[]string{"addr", "add", ns.NodeIP + "/30", "dev", "eth0"},
		[]string{"link", "set", "eth0", "up"},
		[]string{"link", "set", "lo", "up"},
		[]string{"route", "add", "default", "via", ns.HostIP},
	); err != nil {
		return err
	}
	return setupEgress(ns)
}

// setupEgress lets the node's pods out: masquerade inside the node, then the host's part.
func setupEgress(ns nodeState) error {
	if !ns.PodNet {
		return nil
	}
	if err := podnet.EnsureNodeMasq(ns.netnsPath()); err != nil {
		return fmt.Errorf("masquerade in the node: %w", err)
	}
	return setupHostEgress(ns)
}

// setupHostEgress is the host's part of a node's egress: the host's shared chains, and the
// node's own chain with the egress policy (podnet) for what comes in by its link. A vm
// node's guest masquerades its pods itself (its agent, ensureGuestMasq).
func setupHostEgress(ns nodeState) error {
	if !ns.PodNet {
		return nil
	}
	// The deny list kept in node.json already holds the defaults; parsing adds none twice.
	p, err := podnet.ParseEgressPolicy(ns.EgressAllow, ns.EgressDeny)
	if err != nil {
		return err
	}
	// The node's DNS server forwards to the bidder's upstreams: their DNS port is let
	// through whatever the deny list holds.
	for _, u := range ns.DNSUpstreams {
		ap, err := netip.ParseAddrPort(u)
		if err != nil {
			return fmt.Errorf("DNS upstream %q: %w", u, err)
		}
		p.DNS = append(p.DNS, ap)
	}
	host := podnet.Host{}
	if err := host.Ensure(); err != nil {
		return fmt.Errorf("the host's forwarding: %w", err)
	}
	if err := host.AddNode(ns.HostLink, p); err != nil {
		return fmt.Errorf("the node's egress chain: %w", err)
	}
	return nil
}

// makeNamespace adds the node's namespace and its veth pair (the host end HostIP with the
// given prefix length, up; the other end eth0 in the namespace), then runs each of inside as
// `ip -n NETNS ...`.
func makeNamespace(ns nodeState, prefix string, inside ...[]string) error {
	if err := run("ip", "netns", "add", ns.Netns); err != nil {
		return err
	}
	steps := [][]string{
		{"link", "add", ns.HostLink, "type", "veth", "peer", "name", "eth0", "netns", ns.Netns},
		{"addr", "add", ns.HostIP + prefix, "dev", ns.HostLink},
		{"link", "set", ns.HostLink, "up"},
	}
	for _, st := range inside {
		steps = append(steps, append([]string{"-n", ns.Netns}, st...))
	}
	for i, st := range steps {
		if err := run("ip", st...); err != nil {
			return err
		}
		if i == 0 {
			// Strict reverse-path filtering on the host end: the host takes only packets
			// whose source it would route back through this link (the node's own address),
			// so a pod's packet (from the pod subnet) never reaches the host's sockets, and
			// no answer to it leaves by the host's default route.
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+ns.HostLink+"/rp_filter", []byte("1"), 0o644); err != nil {
				return fmt.Errorf("rp_filter on %s: %w", ns.HostLink, err)
			}
			if err := hostFilter(true, ns.HostLink); err != nil {
				return err
			}
		}
	}
	return nil
}

// hostFilterRules refuse, on the host, every connection a node opens through its link: a
// TCP SYN and any UDP. The host needs none (the agent forwards the apiserver port from inside
// the node's namespace; the apiserver opens the connections to the kubelet, whose answers
// pass), and without them a process of the node reaches whatever the host serves on all its
// addresses.
func hostFilterRules(link string) [][]string {
	return [][]string{
		{"-i", link, "-p", "tcp", "--syn", "-j", "DROP"},
		{"-i", link, "-p", "udp", "-j", "DROP"},
	}
}

// hostFilter adds the link's rules to the host's INPUT chain, or removes every copy of them.
func hostFilter(add bool, link string) error {
	for _, r := range hostFilterRules(link) {
		if add {
			if err := run("iptables", append([]string{"-w", "-I", "INPUT"}, r...)...); err != nil {
				return err
			}
			continue
		}
		for i := 0; i < 8 && exec.Command("iptables", append([]string{"-w", "-C", "INPUT"}, r...)...).Run() == nil; i++ {
			if err := run("iptables", append([]string{"-w", "-D", "INPUT"}, r...)...); err != nil {
				return err
			}
		}
	}
	return nil
}

// teardownHost removes what a node left on the host after its agent is gone: containers
// runc still has under the node's runc root, processes that still name its dirs (shims, containers' runc, a kubelet or containerd of an agent
// killed by SIGKILL), mounts under its dirs (the pods' network namespaces are mounted under its run dir), its
// own network namespace, and
// its run dir and work dir. Idempotent.
func teardownHost(ns nodeState) error {
	if ns.Dir == "" {
		return nil
	}
	var errs []error
	if ns.Contained {
		// Process 1 of the node's namespaces names the node's dir: killing it kills every
		// process of the node, containers included. runc's state under the run dir holds
		// PIDs of the node's namespace, which mean other processes out here: no runc delete.
		killProcs(ns)
	} else if err := deleteContainers(ns); err != nil {
		errs = append(errs, err)
	}
	killProcs(ns)
	if err := removeCgroups(ns.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := unmountUnder(ns.Dir, ns.RunDir); err != nil {
		errs = append(errs, err)
	}
	if ns.Netns != "" {
		if _, err := os.Stat("/run/netns/" + ns.Netns); err == nil {
			if err := run("ip", "netns", "del", ns.Netns); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if ns.HostLink != "" {
		if _, err := net.InterfaceByName(ns.HostLink); err == nil {
			_ = run("ip", "link", "del", ns.HostLink)
		}
		if err := hostFilter(false, ns.HostLink); err != nil {
			errs = append(errs, err)
		}
		if ns.PodNet {
			if err := (podnet.Host{}).RemoveNode(ns.HostLink); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, d := range []string{ns.RunDir, filepath.Join(ns.Dir, workDir), filepath.Join(ns.Dir, secretsDir), filepath.Join(ns.Dir, diskImage)} {
		if d == "" || d == "/" {
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Status implements substrate.Substrate.
func (s *Substrate) Status(ctx context.Context, id string) (substrate.GuestStatus, error) {
	if !substrate.ValidID(id) || !s.store.Exists(id) {
		return substrate.GuestStatus{}, substrate.Errorf(Kind, "status", id, substrate.ErrNotFound, "")
	}
	dir := s.store.Dir(id)
	var gs guestState
	if err := guestproc.ReadJSON(filepath.Join(dir, guestFile), &gs); err != nil {
		return substrate.GuestStatus{ID: id, Kind: Kind, Phase: substrate.Failed, Message: "unreadable state: " + err.Error()}, nil
	}
	var rec guestproc.Record
	_ = guestproc.ReadJSON(filepath.Join(dir, guestproc.PidFile), &rec)
	return s.status(id, dir, gs, rec), nil
}

// status: Address is the node's own address (its InternalIP, reachable from the host over
// the veth pair), not 127.0.0.1: a node serves no forwarded port.
func (s *Substrate) status(id, dir string, gs guestState, rec guestproc.Record) substrate.GuestStatus {
	st := substrate.GuestStatus{ID: id, Kind: Kind, Address: gs.Node.NodeIP, Accelerator: "none", StartedAt: gs.StartedAt}
	if gs.Node.Accelerator != "" {
		st.Accelerator = gs.Node.Accelerator
	}
	if t, ok := guestproc.Stopped(dir); ok {
		st.Phase, st.EndedAt = substrate.Stopped, t
		return st
	}
	// Liveness first, then the exit file: the supervisor writes the file before it exits,
	// so a supervisor seen gone has left its exit status (read the other way round, an
	// exit in between reads as a guest gone without one).
	alive := rec.Alive()
	if code, at, ok := guestproc.Exit(dir); ok && !alive {
		st.Phase, st.ExitCode, st.EndedAt = substrate.Exited, code, at
		st.RunningAt = gs.StartedAt
		if code != 0 {
			st.Message = fmt.Sprintf("node agent exited with status %d: %s", code, lastLine(filepath.Join(dir, guestproc.LogFile)))
		}
		return st
	}
	if alive {
		st.Phase, st.PID, st.RunningAt = substrate.Running, rec.PID, gs.StartedAt
		return st
	}
	st.Phase = substrate.Failed
	st.Message = "node agent is gone without an exit status (killed, or the host restarted)"
	return st
}

func lastLine(path string) string {
	b, _ := guestproc.Tail(path, 1)
	return strings.TrimSpace(string(b))
}

// Logs implements substrate.Substrate: the agent's log, which names each step; the
// kubelet's and containerd's own logs are kubelet.log and containerd.log in the guest dir.
// A vm node's log is its serial console, where its agent, containerd and kubelet write.
func (s *Substrate) Logs(ctx context.Context, id string, tail int) ([]byte, error) {
	if substrate.ValidID(id) && nodeStateFor(s.store.Dir(id)).Flavour == FlavourVM {
		b, err := substrate.StateDirLogs(s.store, Kind, id, vmSerial, tail)
		return bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n")), err
	}
	return substrate.StateDirLogs(s.store, Kind, id, guestproc.LogFile, tail)
}

// Stop implements substrate.Substrate: SIGTERM to the agent's group (the agent removes the
// pods, stops the kubelet and containerd), SIGKILL after StopGrace, then the host sweep
// (teardownHost), so a node killed behind the agent's back leaves nothing either.
func (s *Substrate) Stop(ctx context.Context, id string) error {
	if !substrate.ValidID(id) || !s.store.Exists(id) {
		return substrate.Errorf(Kind, "stop", id, substrate.ErrNotFound, "")
	}
	dir := s.store.Dir(id)
	if err := guestproc.Stop(ctx, dir, s.cfg.StopGrace); err != nil {
		return &substrate.Error{Kind: Kind, Op: "stop", ID: id, Err: err}
	}
	if err := teardownHost(nodeStateFor(dir)); err != nil {
		return &substrate.Error{Kind: Kind, Op: "stop", ID: id, Err: err}
	}
	return nil
}

// Remove implements substrate.Substrate: an ended node's host state goes first (a node that
// died by itself was never stopped, and its guest dir is what names that state).
func (s *Substrate) Remove(ctx context.Context, id string) error {
	st, err := s.Status(ctx, id)
	if err != nil {
		return err
	}
	if !st.Phase.Ended() {
		return substrate.Errorf(Kind, "remove", id, substrate.ErrRunning, "stop it first")
	}
	dir := s.store.Dir(id)
	if err := teardownHost(nodeStateFor(dir)); err != nil {
		return &substrate.Error{Kind: Kind, Op: "remove", ID: id, Err: err}
	}
	return os.RemoveAll(dir)
}

// List implements substrate.Substrate.
func (s *Substrate) List(ctx context.Context) ([]substrate.GuestStatus, error) {
	ids, err := s.store.IDs()
	if err != nil {
		return nil, err
	}
	return substrate.ListStatuses(ctx, ids, s.Status), nil
}

// parseOverlay reads Config.OverlayAddress and OverlayPorts: a public IPv4 address that is
// not one nodes or pods use, and a port range (default podnet.DefaultOverlayPorts); a zero
// address when none is set.
func parseOverlay(address, ports string) (netip.Addr, podnet.PortRange, error) {
	r := podnet.DefaultOverlayPorts
	if strings.TrimSpace(address) == "" {
		if strings.TrimSpace(ports) != "" {
			return netip.Addr{}, r, fmt.Errorf("overlay ports %q without an overlay address: the ports are of that address", ports)
		}
		return netip.Addr{}, r, nil
	}
	a, err := netip.ParseAddr(strings.TrimSpace(address))
	if err != nil || !a.Is4() {
		return netip.Addr{}, r, fmt.Errorf("overlay address %q: want this host's IPv4 address as other hosts reach it", address)
	}
	for _, c := range []string{clusternet.NodeNetwork, clusternet.ClusterCIDR, clusternet.ServiceCIDR, "127.0.0.0/8", "169.254.0.0/16", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4"} {
		if netip.MustParsePrefix(c).Contains(a) {
			return netip.Addr{}, r, fmt.Errorf("overlay address %s is in %s, which no other host reaches as this one", a, c)
		}
	}
	if strings.TrimSpace(ports) != "" {
		if r, err = podnet.ParsePortRange(ports); err != nil {
			return netip.Addr{}, r, err
		}
	}
	return a, r, nil
}

// prepareNamespace makes what a namespace node has before its network and agent: its
// secrets, its disk (disk.go; the agent mounts it), and, when the host publishes overlay
// endpoints, its forwarded endpoint. The error comes with its substrate reason.
func (s *Substrate) prepareNamespace(ns *nodeState, spec substrate.GuestSpec) (reason, err error) {
	ns.CNIGate = cniGateBeside(ns.Binary)
	if ns.Contained {
		rf, err := s.rootFiles.get(ns.Binary, ns.Runtime)
		if err != nil {
			return substrate.ErrUnavailable, fmt.Errorf("the node's root: %w", err)
		}
		ns.Root = &rf
	}
	if err := writeSecrets(filepath.Join(ns.Dir, secretsDir), spec.Secrets); err != nil {
		return substrate.ErrBoot, err
	}
	if ns.DiskMiB, err = diskMiB(spec.DiskMiB, s.cfg.DiskMiB); err != nil {
		return substrate.ErrInvalidSpec, err
	}
	if err := makeDisk(ns.Dir, ns.DiskMiB); err != nil {
		return substrate.ErrBoot, fmt.Errorf("the node's disk: %w", err)
	}
	if s.overlayPublic.IsValid() {
		// A boot failing from here on removes the forwarding with the node's other host
		// rules (teardownHost of the node as made so far, RemoveNode).
		ep, err := podnet.Host{}.PublishOverlay(ns.HostLink, netip.MustParseAddr(ns.NodeIP), s.overlayPublic, s.overlayPorts, 0)
		if err != nil {
			return substrate.ErrBoot, fmt.Errorf("overlay endpoint: %w", err)
		}
		ns.OverlayEndpoint = ep.String()
	}
	return nil, nil
}
