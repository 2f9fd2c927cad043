package node

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/vm"
	"socialweb.computer/internal/substrate/vm/image"
)

// Flavours of node: how a node is kept apart from the bidder host and from other nodes.
const (
	// FlavourNamespace runs the node's containerd and kubelet on the host, in a network
	// namespace, cgroup and state dirs of its own: for hosts without a usable hypervisor.
	FlavourNamespace = "namespace"
	// FlavourVM runs them inside a qemu microVM (the vm substrate's kernel and initramfs, a
	// shared read-only root disk and a state disk per node), on a tap device in the node's
	// network namespace: the node's pods share no kernel with the host.
	FlavourVM = "vm"
	// FlavourAuto is vm where the host runs guests at hardware speed (a vm image is there and
	// the vm substrate's accelerator probe says kvm), namespace otherwise.
	FlavourAuto = "auto"
)

// chooseFlavour is FlavourAuto's decision: vmErr is why the vm flavour cannot run at all
// (nil when it can), accel and accelReason the accelerator probe's answer.
func chooseFlavour(vmErr error, accel, accelReason string) (flavour, reason string) {
	switch {
	case vmErr != nil:
		return FlavourNamespace, "no vm nodes: " + vmErr.Error()
	case accel != vm.KVM:
		return FlavourNamespace, "no vm nodes: guests would run under " + accel + " (" + accelReason + ")"
	}
	return FlavourVM, "vm nodes under kvm (" + accelReason + ")"
}

// Defaults of a vm node's machine when the spec leaves them zero.
const (
	vmDefaultCPUs   = 2
	vmDefaultMemMiB = 1536
)

// vm flavour files in a guest dir (under work/, removed on Stop).
const (
	vmStateDisk = "state.ext4"
	vmInitrd    = "initrd"
	vmSerial    = "serial.log"
	vmQEMULog   = "qemu.log"
)

// vmAddrs is a vm node's /29 in 10.79.0.0/16: the host's end of the veth pair (.1), the
// guest's eth0, its InternalIP (.2), and the bridge in the node's namespace (.3), where the
// host agent serves the apiserver port to the guest.
func vmAddrs(i int) (host, node, bridge string) {
	b := 8 * i
	p := fmt.Sprintf("10.79.%d.", b/256)
	return p + fmt.Sprint(b%256+1), p + fmt.Sprint(b%256+2), p + fmt.Sprint(b%256+3)
}

// newVM checks what the vm flavour needs besides the host's runtime files (which go onto
// the root disk): qemu and an image whose initramfs carries the node modules.
func newVM(cfg Config) (*vm.Substrate, error) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return nil, fmt.Errorf("%w: mkfs.ext4 missing: run hack/install-guest-deps.sh (e2fsprogs)", substrate.ErrUnavailable)
	}
	v, err := vm.New(vm.Config{StateDir: filepath.Join(cfg.StateDir, ".vm"), ImageDir: cfg.VMImageDir, QEMU: cfg.QEMU, Accelerator: cfg.Accelerator})
	if err != nil {
		return nil, err
	}
	if m := v.Image().Manifest; !m.CarriesNodeModules() {
		return nil, fmt.Errorf("%w: the vm image in %s carries node modules %v, want %v: rebuild it (socialweb image build)",
			substrate.ErrUnavailable, cfg.VMImageDir, m.NodeModules, image.NodeModules)
	}
	return v, nil
}

// prepareVM makes a vm node's disks and machine: the shared root disk (built once per
// binary), the node's state disk holding its join bundle, its node.json and the images,
// its initramfs (the image's, plus the boot script), and the qemu command line.
func (s *Substrate) prepareVM(ctx context.Context, ns *nodeState, spec substrate.GuestSpec) error {
	// A vm node runs the host's runtime: its disk is built for every vm node alike.
	rf, err := s.rootFiles.get(s.cfg.Binary, nodeRuntime{})
	if err != nil {
		return fmt.Errorf("root disk: %w", err)
	}
	root, err := ensureRootDisk(ctx, filepath.Join(s.cfg.StateDir, ".images"), rf)
	if err != nil {
		return fmt.Errorf("root disk: %w", err)
	}
	if err := os.MkdirAll(ns.work(), 0o700); err != nil {
		return err
	}
	seed, err := os.MkdirTemp(ns.work(), ".seed-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(seed)
	u, _ := url.Parse(ns.Server)
	guest := nodeState{
		Flavour: FlavourVM, NodeName: ns.NodeName, Server: ns.Server, Index: ns.Index,
		Upstream: net.JoinHostPort(ns.BridgeIP, u.Port()), HostIP: ns.HostIP, NodeIP: ns.NodeIP,
		RunDir: "/run/swnode", Dir: guestStateDir + "/node", Binary: guestBinary,
		ImageDir: guestStateDir + "/images", PauseTar: guestStateDir + "/pause.tar",
		PodSubnet: ns.PodSubnet, PodNet: ns.PodNet, Cgroup: "socialweb-node", Console: true,
		// The gate plugin: its own binary in the root disk (rootTopFiles), or the
		// binary itself.
		CNIGate:      guestBinary,
		DNSUpstreams: ns.DNSUpstreams, DNSUpstreamWhy: ns.DNSUpstreamWhy,
	}
	if cniGateBeside(ns.Binary) != ns.Binary {
		guest.CNIGate = guestCNIGate
	}
	// The seed is the state disk's root, the guest's /var/lib.
	in := func(p string) string { return filepath.Join(seed, strings.TrimPrefix(p, guestVarLib)) }
	for _, d := range []string{in(guest.Dir), in(guest.ImageDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := guestproc.WriteJSON(filepath.Join(in(guest.Dir), nodeFile), guest); err != nil {
		return err
	}
	if err := writeSecrets(filepath.Join(in(guest.Dir), secretsDir), spec.Secrets); err != nil {
		return err
	}
	if _, err := copyInto(seed, ns.PauseTar, strings.TrimPrefix(guest.PauseTar, guestVarLib)); err != nil {
		return err
	}
	if ns.ImageDir != "" {
		for _, t := range sortedGlob(filepath.Join(ns.ImageDir, "*.tar")) {
			if _, err := copyInto(seed, t, filepath.Join(strings.TrimPrefix(guest.ImageDir, guestVarLib), filepath.Base(t))); err != nil {
				return err
			}
		}
	}
	state := ns.work(vmStateDisk)
	if err := writeStateDisk(ctx, state, seed); err != nil {
		return fmt.Errorf("state disk: %w", err)
	}

	base, err := os.ReadFile(s.vm.Image().Initrd)
	if err != nil {
		return err
	}
	ar := image.NewArchive()
	ar.Add(image.Entry{Name: "userdata/init", Kind: image.File, Mode: 0o700, Data: []byte(vmBootScript(*ns))})
	ar.Add(image.Entry{Name: "userdata/env", Kind: image.File, Mode: 0o600, Data: []byte("export SOCIALWEB_HOSTNAME=" + ns.NodeName + "\n")})
	var extra bytes.Buffer
	if err := ar.WriteGzip(&extra); err != nil {
		return err
	}
	if err := os.WriteFile(ns.work(vmInitrd), append(base, extra.Bytes()...), 0o600); err != nil {
		return err
	}

	cpus, mem := spec.CPUs, spec.MemMiB
	if cpus == 0 {
		cpus = vmDefaultCPUs
	}
	if mem == 0 {
		mem = vmDefaultMemMiB
	}
	argv, accel, err := s.vm.MachineArgv(ctx, vm.Machine{
		Serial: filepath.Join(ns.Dir, vmSerial), Initrd: ns.work(vmInitrd), CPUs: cpus, MemMiB: mem,
		Devices: []string{
			"-drive", "file=" + root + ",format=raw,if=none,id=root,readonly=on",
			"-device", "virtio-blk-device,drive=root",
			"-drive", "file=" + state + ",format=raw,if=none,id=state",
			"-device", "virtio-blk-device,drive=state",
			"-netdev", "tap,id=n0,ifname=" + vmTap + ",script=no,downscript=no",
			"-device", "virtio-net-device,netdev=n0",
		},
	})
	if err != nil {
		return fmt.Errorf("accelerator: %w", err)
	}
	ns.QEMUArgv, ns.Accelerator = argv, accel
	return nil
}

// vmTap is the tap device in a vm node's namespace (each node has a namespace of its own).
const vmTap = "tap0"

// vmBootScript is the guest's userData, run by the image's init once eth0 is up: it loads
// the node modules, mounts the root disk read-only with the state disk, the kernel's file
// systems and cgroup v2 below it, gives eth0 the node's address, and becomes the node agent
// in the root disk (its stderr, like the kubelet's and containerd's logs, is the serial
// console). The root disk is moved over the initramfs's / first, as switch_root does (the
// script is not PID 1, which switch_root requires): a process that joins a container's mount
// namespace (`kubectl exec`) is put at the namespace's top-most root, the container's, and
// with a plain chroot that was the initramfs instead.
func vmBootScript(ns nodeState) string {
	return fmt.Sprintf(`set -e
for m in $(cat /%s); do insmod /lib/modules/$m.ko; done
i=0
until root=$(findfs LABEL=%s 2>/dev/null) && state=$(findfs LABEL=%s 2>/dev/null); do
	i=$((i+1))
	if [ $i -gt 100 ]; then echo "socialweb-node: disks not found"; exit 1; fi
	sleep 0.1
done
mkdir -p /node
mount -t ext4 -o ro "$root" /node
mount -t ext4 "$state" /node%s
mount -t proc proc /node/proc
mount -t sysfs sysfs /node/sys
mount -t cgroup2 cgroup2 /node/sys/fs/cgroup
mount -t devtmpfs devtmpfs /node/dev
mount -t tmpfs -o mode=0755 tmpfs /node/run
mount -t tmpfs -o mode=1777 tmpfs /node/tmp
mount -t tmpfs -o mode=0755 tmpfs /node/var/log
ip addr flush dev eth0
ip addr add %s/29 dev eth0
ip route add default via %s
echo "socialweb-node: disks mounted, eth0 %s"
cd /node
mount --move . /
exec chroot . %s node-agent %s/node
`, image.NodeModuleOrderFile, rootDiskLabel, stateDiskLabel, guestVarLib, ns.NodeIP, ns.HostIP, ns.NodeIP, guestBinary, guestStateDir)
}

// setupVMNetwork makes a vm node's namespace: the veth pair (host end HostIP/29), and in the
// namespace a bridge holding the veth's end and the tap qemu opens, the bridge at BridgeIP.
// The guest, on the tap, is on the host's link: the apiserver reaches its kubelet at NodeIP.
func setupVMNetwork(ns nodeState) error {
	if err := makeNamespace(ns, "/29",
		[]string{"link", "add", "br0", "type", "bridge"},
		[]string{"tuntap", "add", "dev", vmTap, "mode", "tap"},
		[]string{"link", "set", "eth0", "master", "br0"},
		[]string{"link", "set", vmTap, "master", "br0"},
		[]string{"addr", "add", ns.BridgeIP + "/29", "dev", "br0"},
		[]string{"link", "set", "eth0", "up"},
		[]string{"link", "set", vmTap, "up"},
		[]string{"link", "set", "br0", "up"},
		[]string{"link", "set", "lo", "up"},
	); err != nil {
		return err
	}
	return setupHostEgress(ns)
}

// runVMHost is the agent of a vm node on the host: it serves the apiserver port to the guest
// on the namespace's bridge, forwarding to the tenant gate on the host's loopback, and runs
// qemu inside the namespace until a signal (qemu is stopped; the guest's state goes with its
// disk) or qemu's end.
func runVMHost(ns nodeState, logf func(string, ...any), sigs <-chan os.Signal) int {
	u, err := url.Parse(ns.Server)
	if err != nil {
		logf("error: %v", err)
		return 2
	}
	gate := net.JoinHostPort(u.Hostname(), u.Port())
	ln, err := listenInNetns(ns.netnsPath(), net.JoinHostPort(ns.BridgeIP, u.Port()))
	if err != nil {
		logf("error: serve the apiserver port in %s: %v", ns.Netns, err)
		return 1
	}
	defer ln.Close()
	go forwardTo(ln, gate)
	logf("serving %s in %s for the guest, forwarded to %s", ln.Addr(), ns.Netns, gate)

	lf, err := os.OpenFile(filepath.Join(ns.Dir, vmQEMULog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		logf("error: %v", err)
		return 1
	}
	defer lf.Close()
	// nsenter execs qemu in the namespace (no fork without a pid namespace), so the process
	// is qemu itself.
	cmd := exec.Command("nsenter", append([]string{"--net=" + ns.netnsPath(), "--"}, ns.QEMUArgv...)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Dir = ns.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf("error: start qemu: %v", err)
		return 1
	}
	logf("qemu started (pid %d, %s): node %s at %s", cmd.Process.Pid, ns.Accelerator, ns.NodeName, ns.NodeIP)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case s := <-sigs:
		logf("%v: stopping the machine", s)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			logf("qemu did not stop within 5s: SIGKILL")
			_ = cmd.Process.Kill()
			<-done
		}
		logf("stopped")
		return 0
	case err := <-done:
		tail, _ := guestproc.Tail(filepath.Join(ns.Dir, vmSerial), 5)
		qtail, _ := guestproc.Tail(filepath.Join(ns.Dir, vmQEMULog), 3)
		logf("error: qemu ended: %v; qemu: %s; the end of the console:\n%s", err, strings.TrimSpace(string(qtail)), strings.TrimRight(string(tail), "\n"))
		return 1
	}
}
