package node

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"socialweb.computer/internal/clusternet"
	"socialweb.computer/internal/netns"
	"socialweb.computer/internal/netpol/podgate"
	"socialweb.computer/internal/podnet"
	"socialweb.computer/internal/selfexe"
	"socialweb.computer/internal/substrate/guestproc"
)

// The agent is the node guest's process (`socialweb node-agent DIR`, under guestproc's
// supervisor): it forwards the apiserver port into the node's namespace, starts containerd,
// imports the images, starts the kubelet, and on SIGTERM (or when either child ends) tears
// the node down in order: kubelet, pods (through the CRI, so CNI releases their addresses and
// their namespaces are unmounted), containerd, then whatever is left of them.

// Paths in a node.
func (ns nodeState) work(p ...string) string {
	return filepath.Join(append([]string{ns.Dir, workDir}, p...)...)
}
func (ns nodeState) sock() string { return filepath.Join(ns.RunDir, "containerd.sock") }

// kubeletRoot is the kubelet's --root-dir: a link in the run dir to work/kubelet.
func (ns nodeState) kubeletRoot() string    { return filepath.Join(ns.RunDir, "kubelet") }
func (ns nodeState) netnsPath() string      { return "/run/netns/" + ns.Netns }
func (ns nodeState) secret(k string) string { return filepath.Join(ns.Dir, secretsDir, k) }

// RunAgent runs the node in dir until SIGTERM or SIGINT; it returns the exit status.
func RunAgent(dir string) int {
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s node-agent: %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	var ns nodeState
	if err := guestproc.ReadJSON(filepath.Join(dir, nodeFile), &ns); err != nil {
		logf("error: %v", err)
		return 2
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	if ns.Flavour == FlavourVM && ns.Netns != "" {
		return runVMHost(ns, logf, sigs)
	}
	a := &agent{ns: ns, logf: logf, ended: make(chan string, 8)}
	err := a.start()
	if err == nil {
		select {
		case s := <-sigs:
			logf("%v: stopping the node", s)
		case why := <-a.ended:
			err = errors.New(why)
		}
	}
	a.teardown()
	if err != nil {
		logf("error: %v", err)
		return 1
	}
	logf("stopped")
	return 0
}

type agent struct {
	ns         nodeState
	logf       func(string, ...any)
	ended      chan string
	ln         net.Listener
	root       *exec.Cmd // process 1 of a contained node's namespaces
	containerd *exec.Cmd
	kubelet    *exec.Cmd
	podnet     *restartable
	netpol     *restartable

	// Services and DNS (services.go): kube-proxy, the DNS server, the forwarder of the
	// kubernetes Service's endpoint.
	proxy, dns   *restartable
	apiFwd       *apiForwarder
	stopServices func()
	// stopTunnel closes the node's tunnel to its control plane (tunnel.go).
	stopTunnel func()
	// cpuManager is the kubelet config's CPU manager stanza for the node's cpuset.
	cpuManager string
}

func (a *agent) start() error {
	ns := a.ns
	// The node's disk on its work dir before anything is written there, and before the
	// agent joins the node's cgroups (whose device rules deny block devices).
	if ns.Contained && ns.DiskMiB > 0 {
		if err := mountDisk(ns); err != nil {
			return err
		}
		a.logf("disk: %d MiB on %s", ns.DiskMiB, ns.work())
	}
	dirs := []string{ns.RunDir, ns.work("containerd"), ns.work("kubelet"), ns.work("cni", "net.d"), ns.work("cni", "ipam"), ns.work("pod-logs")}
	if ns.Flavour == FlavourVM && ns.Netns == "" {
		// In a vm guest /var/lib is the node's state disk: the local-path volumes' directory
		// is made there (a contained node mounts its own work/volumes, contain.go).
		dirs = append(dirs, VolumesDir)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if ns.Runtime.UserNamespaces() {
		// Passable by a pod's uid 0 in its user namespace: its root is under the run dir
		// (contain.go makes the path to it in the node's root alike). The guest dir stays
		// 0700: runc binds a pod's volumes from there idmapped, from outside the pod.
		if err := os.Chmod(ns.RunDir, 0o711); err != nil {
			return err
		}
	}
	// The kubelet makes unix sockets under its root dir (pod-resources, plugins), and a
	// socket's path holds at most 107 bytes: a guest dir deep in a data dir is too long. It
	// is given the short path of a link in the run dir; its data stays in the node's dir.
	if err := os.Symlink(ns.work("kubelet"), ns.kubeletRoot()); err != nil && !os.IsExist(err) {
		return err
	}
	// 0. The node's own cgroups, with the contract's limits: every process below joins them.
	limits := ns.limits(probeCPUHost(ns.Cgroup))
	cg, err := joinCgroups(ns.Cgroup, limits)
	if err != nil {
		return err
	}
	if err := guestproc.WriteJSON(filepath.Join(ns.Dir, cgroupsFile), cg); err != nil {
		return err
	}
	a.logf("cgroups %v, limits %s", cg, limits)
	a.cpuManager = kubeletCPUManager(onlineCPUs(), limits.CPUSet)

	// 1. The apiserver port, forwarded into the namespace on the same address.
	u, err := url.Parse(ns.Server)
	if err != nil {
		return err
	}
	addr := net.JoinHostPort(u.Hostname(), u.Port())
	// In a vm guest (no namespace to enter) the address is on the guest's own loopback and
	// the upstream is the host agent on the namespace's bridge.
	upstream, where := addr, " in "+ns.Netns
	if ns.Netns == "" {
		upstream, where = ns.Upstream, ""
	}
	listenAt := addr
	if h := u.Hostname(); h != LocalGate {
		// A control plane on another host: the forward listens on the node's loopback, and
		// the node's own TCP connections to the control plane's address and port are sent
		// to it. The address itself stays off the node: that host publishes the overlay
		// endpoints of its nodes on it too, and the node's overlay packets to them must
		// leave the node.
		listenAt = net.JoinHostPort(LocalGate, u.Port())
		if err := ns.forwardRemoteGate(h, u.Port()); err != nil {
			return fmt.Errorf("the node's connections to the control plane at %s: %w", addr, err)
		}
	}
	a.ln, err = ns.listen(listenAt)
	if err != nil {
		return fmt.Errorf("forward %s%s: %w", addr, where, err)
	}
	go forwardTo(a.ln, upstream)
	a.logf("forwarding %s%s to %s", addr, where, upstream)

	// 2. The node's own root, mount, PID, IPC, UTS and cgroup namespaces.
	if ns.Contained {
		t := time.Now()
		if err := a.startRoot(); err != nil {
			return err
		}
		a.logf("root ready in %s: process 1 is %d", time.Since(t).Round(time.Millisecond), a.root.Process.Pid)
	}

	// 3. containerd in the node.
	if err := copyRegistryConfig(ns.Registry, ns.registryDir()); err != nil {
		return err
	}
	if err := os.WriteFile(ns.work("containerd", "config.toml"), []byte(containerdConfig(ns)), 0o600); err != nil {
		return err
	}
	if err := writeCNIBinDir(ns); err != nil {
		return fmt.Errorf("the node's CNI plugins: %w", err)
	}
	// The CNI config names the node's pod subnet: the Node's spec.podCIDR, which the pod
	// network process writes once the controller-manager has assigned it (the node is
	// NotReady until then). A node booted before that has its fixed subnet.
	if !ns.PodNet {
		if err := writeCNIConfig(ns, ns.PodSubnet); err != nil {
			return err
		}
	}
	a.logf("node runtime: %s (%s)", orHost(ns.Runtime.Dir), ns.Runtime.Why)
	if ns.Runtime.Dir != "" {
		// containerd asks the shim (`-info`), and the shim looks runc up by name: both
		// must find the node runtime's, not the host's.
		os.Setenv("PATH", ns.Runtime.Dir+":"+os.Getenv("PATH"))
	}
	a.containerd, err = a.spawn("containerd", "containerd.log", ns.Runtime.path("containerd"), "--config", ns.work("containerd", "config.toml"))
	if err != nil {
		return err
	}
	if err := waitFor(15*time.Second, func() bool { return ctr(ns, "version") == nil }); err != nil {
		return fmt.Errorf("containerd did not answer on %s within 15s (see containerd.log)", ns.sock())
	}
	a.logf("containerd up")

	// 4. Images: the sandbox image, then every tarball of the image dir.
	tars := []string{ns.PauseTar}
	if ns.ImageDir != "" {
		m, _ := filepath.Glob(filepath.Join(ns.ImageDir, "*.tar"))
		sort.Strings(m)
		tars = append(tars, m...)
	}
	for _, t := range tars {
		if err := ctr(ns, "-n", "k8s.io", "images", "import", t); err != nil {
			return fmt.Errorf("import %s: %w", t, err)
		}
		a.logf("imported %s", t)
	}

	// 5. The kubelet.
	if err := writeKubeletConfig(ns, kubeletConfig(ns)+a.cpuManager); err != nil {
		return err
	}
	kubeletArgv := []string{ns.Binary, "kube", "kubelet",
		"--config", ns.work("kubelet", "config.yaml"),
		"--kubeconfig", ns.secret(SecretKubeconfig),
		"--node-ip", ns.NodeIP,
		"--hostname-override", ns.NodeName,
		"--root-dir", ns.kubeletRoot(),
		"--cert-dir", ns.work("kubelet", "pki"),
	}
	labels := maps.Clone(ns.Labels)
	if ns.Runtime.UserNamespaces() {
		// The Node says so: a pod with hostUsers: false selects it (LabelUserNamespaces).
		if labels == nil {
			labels = map[string]string{}
		}
		labels[LabelUserNamespaces] = "true"
	}
	if len(labels) > 0 {
		kubeletArgv = append(kubeletArgv, "--node-labels", nodeLabelsFlag(labels))
	}
	a.kubelet, err = a.spawn("kubelet", "kubelet.log", kubeletArgv...)
	if err != nil {
		return err
	}
	a.logf("kubelet started: node %s, InternalIP %s", ns.NodeName, ns.NodeIP)
	if err := a.startTunnel(); err != nil {
		return fmt.Errorf("tunnel: %w", err)
	}

	// 6. The pod network: the Node's pod CIDR into the CNI config, the overlay to the
	// cluster's other nodes (podnet), in the node's namespaces like containerd. A vm
	// guest masquerades its pods to its own address for the host's egress chain (a
	// namespace node's masquerade is made on the host with its namespace, setupEgress).
	if ns.PodNet && ns.Flavour == FlavourVM && ns.Netns == "" {
		if err := podnet.EnsureNodeMasq(""); err != nil {
			return fmt.Errorf("masquerade in the node: %w", err)
		}
	}
	if ns.PodNet {
		a.podnet, err = a.spawnRestartable("pod network", "podnet.log", ns.Binary, "node-podnet", ns.Dir)
		if err != nil {
			return err
		}
		a.logf("pod network started")
	}

	// 7. Services and DNS.
	if err := a.startServices(); err != nil {
		return fmt.Errorf("services: %w", err)
	}
	// 8. NetworkPolicy, as the node (internal/netpol), with the services' kubeconfig (the
	// node's renewed client certificate).
	netpolArgv := []string{ns.Binary, "kube", "netpol", "--kubeconfig", ns.servicesPath("kubeconfig"), "--node-name", ns.NodeName}
	if ns.CNIGate != "" {
		netpolArgv = append(netpolArgv, "--gate-socket", ns.netpolSocket())
	}
	a.netpol, err = a.spawnRestartable("netpol", "netpol.log", netpolArgv...)
	if err != nil {
		return err
	}
	a.logf("NetworkPolicy enforcement started")
	return nil
}

// spawn starts name inside the node's network namespace (nsenter --net: `ip netns exec`
// would remount /sys and hide the cgroup mounts from the kubelet), output to logName in the
// guest dir, in a process group of its own; its end is reported on a.ended.
func (a *agent) spawn(name, logName string, argv ...string) (*exec.Cmd, error) {
	return a.spawnWith(name, logName, func(why string) { a.ended <- why }, argv...)
}

// spawnWith is spawn with what to do when the process ends (onEnd gets why).
func (a *agent) spawnWith(name, logName string, onEnd func(why string), argv ...string) (*exec.Cmd, error) {
	lf, err := os.OpenFile(filepath.Join(a.ns.Dir, logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	switch {
	case a.ns.Contained:
		argv = enterArgv(a.root.Process.Pid, argv)
	case a.ns.Netns != "":
		argv = append([]string{"nsenter", "--net=" + a.ns.netnsPath(), "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if a.ns.Console {
		cmd.Stdout = io.MultiWriter(lf, os.Stderr)
		cmd.Stderr = cmd.Stdout
	}
	cmd.Dir = a.ns.Dir
	// A process group of its own: Stop's SIGTERM to the agent's group must not reach
	// containerd before the agent has removed the pods through it. If the agent dies, the
	// kernel kills the child (Pdeathsig) and Stop's sweep finds the rest.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		err := cmd.Wait()
		lf.Close()
		// The end of its log says why, in the agent's own log: the guest's dir (and the
		// process's log with it) may be gone before anyone reads it.
		tail, _ := guestproc.Tail(filepath.Join(a.ns.Dir, logName), 5)
		onEnd(fmt.Sprintf("%s ended: %v; the end of %s:\n%s", name, err, logName, strings.TrimRight(string(tail), "\n")))
	}()
	return cmd, nil
}

// teardown stops everything start started, in order; best effort, logged.
func (a *agent) teardown() {
	ns := a.ns
	stop := func(name string, c *exec.Cmd, grace time.Duration) {
		if c == nil || c.Process == nil || c.ProcessState != nil {
			return
		}
		// The process group: in a contained node the process is nsenter's child, which
		// nsenter does not pass signals to.
		pgid := c.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		deadline := time.Now().Add(grace)
		for time.Now().Before(deadline) {
			if groupGone(pgid) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		a.logf("%s did not stop within %v: SIGKILL", name, grace)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	if a.stopTunnel != nil {
		a.stopTunnel()
	}
	stop("netpol", a.netpol.halt(), 5*time.Second)
	a.stopServicesForwarder()
	stop("kube-proxy", a.proxy.halt(), 5*time.Second)
	stop("node-dns", a.dns.halt(), 5*time.Second)
	stop("pod network", a.podnet.halt(), 5*time.Second)
	stop("kubelet", a.kubelet, 5*time.Second)
	if a.containerd != nil {
		if n, err := removePods(ns); err != nil {
			a.logf("removing pods: %v", err)
		} else if n > 0 {
			a.logf("removed %d pod sandboxes", n)
		}
	}
	stop("containerd", a.containerd, 5*time.Second)
	if a.ln != nil {
		a.ln.Close()
	}
	killProcs(ns)
	if err := unmountUnder(ns.Dir, ns.RunDir); err != nil {
		a.logf("unmount: %v", err)
	}
}

// removePods stops and removes every pod sandbox through the CRI.
func removePods(ns nodeState) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+ns.sock(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	rs := criv1.NewRuntimeServiceClient(conn)
	resp, err := rs.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{})
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, sb := range resp.Items {
		if _, err := rs.StopPodSandbox(ctx, &criv1.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := rs.RemovePodSandbox(ctx, &criv1.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, err)
		}
	}
	return len(resp.Items), errors.Join(errs...)
}

// ctr runs ctr against the node's containerd.
func ctr(ns nodeState, args ...string) error {
	out, err := exec.Command(ns.Runtime.path("ctr"), append([]string{"--address", ns.sock()}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func waitFor(d time.Duration, ok func() bool) error {
	deadline := time.Now().Add(d)
	for {
		if ok() {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// listenInNetns opens a TCP listener inside the network namespace at nsPath.
// listen listens on addr in the node's network namespace: the agent's own in a vm guest.
func (ns nodeState) listen(addr string) (net.Listener, error) {
	if ns.Netns == "" {
		return net.Listen("tcp", addr)
	}
	return listenInNetns(ns.netnsPath(), addr)
}

// runInNet runs argv in the node's network namespace: the agent's own in a vm guest.
func (ns nodeState) runInNet(argv ...string) error {
	if ns.Netns == "" {
		return run(argv[0], argv[1:]...)
	}
	return run("nsenter", append([]string{"--net=" + ns.netnsPath(), "--"}, argv...)...)
}

func listenInNetns(nsPath, addr string) (net.Listener, error) {
	var ln net.Listener
	err := netns.Do(nsPath, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil && ln != nil {
		ln.Close()
		return nil, err
	}
	return ln, err
}

// dialInNetns connects from inside the network namespace at nsPath (a socket belongs to
// the namespace it was made in).
func dialInNetns(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := netns.Do(nsPath, func() (err error) {
		c, err = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
		return err
	})
	if err != nil && c != nil {
		c.Close()
		return nil, err
	}
	return c, err
}

// forwardTo accepts on ln and dials addr, copying both ways.
func forwardTo(ln net.Listener, addr string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			u, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return
			}
			defer u.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(u, c); closeWrite(u); done <- struct{}{} }()
			go func() { _, _ = io.Copy(c, u); closeWrite(c); done <- struct{}{} }()
			<-done
			<-done
		}()
	}
}

func closeWrite(c net.Conn) {
	if t, ok := c.(*net.TCPConn); ok {
		_ = t.CloseWrite()
	}
}

// groupGone says no live process is left in process group pgid.
func groupGone(pgid int) bool {
	if syscall.Kill(-pgid, 0) != nil {
		return true
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := guestproc.ReadStat(pid); err == nil && st.PGID == pgid && st.State != 'Z' && st.State != 'X' {
			return false
		}
	}
	return true
}

func isZombie(pid int) bool {
	st, err := guestproc.ReadStat(pid)
	return err != nil || st.State == 'Z' || st.State == 'X'
}

// killProcs SIGKILLs every process whose command line names the node's guest dir or run dir
// (containerd, its shims: `-address <run dir>/containerd.sock`, the kubelet), except this
// process and its supervisor. Containers' own processes do not name those dirs: the CRI
// removal in the agent's teardown ends them (a node whose agent was SIGKILLed can leave
// them behind; see docs/substrates.md).
func killProcs(ns nodeState) {
	self, parent := os.Getpid(), os.Getppid()
	for round := 0; round < 20; round++ {
		var left []int
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self || pid == parent {
				continue
			}
			cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err != nil || isZombie(pid) {
				continue
			}
			s := string(cmd)
			if strings.Contains(s, "node-agent\x00") {
				continue // the agent itself (a supervisor sweep runs after it is gone)
			}
			if (ns.Dir != "" && strings.Contains(s, ns.Dir)) || (ns.RunDir != "" && strings.Contains(s, ns.RunDir)) {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			return
		}
		for _, p := range left {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// unmountUnder lazily unmounts every mount point under the given dirs, deepest first.
func unmountUnder(dirs ...string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, d := range dirs {
			if d != "" && d != "/" && (mp == d || strings.HasPrefix(mp, d+"/")) {
				points = append(points, mp)
			}
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("umount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// containerdConfig: own root, state, socket and runc root; CRI with the local sandbox image,
// restrict_oom_score_adj (root here lacks CAP_SYS_RESOURCE: without it every sandbox fails
// "can't get final child's PID from pipe"), cgroupfs, the pods' network namespaces mounted
// under the state dir, CNI config and plugins from our dirs, registries from the node's copy
// of the operator's hosts directory; no metrics or debug listeners.
//
// The node runtime (containerd v2) reads version 3, where the CRI plugin is split into its
// images and runtime plugins; the host's containerd 1.6 reads version 2.
func containerdConfig(ns nodeState) string {
	if ns.Runtime.Dir != "" {
		return containerdConfigV3(ns)
	}
	return containerdHeader(ns, 2, "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
		"io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs") + fmt.Sprintf(`
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %q
`, PauseImage, filepath.Join(ns.RunDir, "runc"), ns.cniBinDir(), ns.work("cni", "net.d"), ns.registryDir())
}

// containerdHeader is what both config versions share: the node's own root, state and
// sockets, the tracing plugin and unused snapshotters off (besides disabled), no debug or
// metrics listeners.
func containerdHeader(ns nodeState, version int, disabled ...string) string {
	plugins := append([]string{"io.containerd.internal.v1.tracing"}, disabled...)
	quoted := make([]string, len(plugins))
	for i, p := range plugins {
		quoted[i] = strconv.Quote(p)
	}
	return fmt.Sprintf(`version = %d
root = %q
state = %q
disabled_plugins = [%s]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, version, ns.work("containerd", "root"), filepath.Join(ns.RunDir, "state"), strings.Join(quoted, ", "),
		ns.sock(), ns.sock()+".ttrpc", ns.work("containerd", "opt"))
}

// containerdConfigV3 is containerdConfig for containerd v2: the runc shim and runc are the
// node runtime's (by path: the host's on PATH are never taken for them).
func containerdConfigV3(ns nodeState) string {
	return containerdHeader(ns, 3, "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
		"io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs") + fmt.Sprintf(`
[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %q

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = %q
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q
        BinaryName = %q
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q
    max_conf_num = 1
`, PauseImage, ns.registryDir(),
		ns.Runtime.path("containerd-shim-runc-v2"), filepath.Join(ns.RunDir, "runc"), ns.Runtime.path("runc"),
		ns.cniBinDir(), ns.work("cni", "net.d"))
}

// orHost names a runtime dir for a log line.
func orHost(dir string) string {
	if dir == "" {
		return "the host's containerd and runc"
	}
	return dir
}

// podBridge is the node's pod bridge.
const podBridge = "cni0"

// writeCNIConfig writes the node's CNI config for subnet through a rename, so containerd,
// which watches the dir, never reads half of it.
func writeCNIConfig(ns nodeState, subnet string) error {
	dir := ns.work("cni", "net.d")
	tmp := filepath.Join(dir, ".conflist.tmp")
	if err := os.WriteFile(tmp, []byte(cniConfig(ns, subnet)), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "10-socialweb.conflist"))
}

// cniConfig: a bridge inside the node's namespace with host-local addresses kept in the
// node's own dir (not /var/lib/cni/networks, shared by every node on the host). The bridge
// is each pod's default gateway: Service addresses (routed nowhere else) reach the node's
// kube-proxy rules, other nodes' pod subnets the overlay, the rest the node's masquerade.
// Pods get the overlay's MTU, so a packet to another node's pod fits the tunnel without
// fragmenting.
func cniConfig(ns nodeState, subnet string) string {
	gate := ""
	if ns.CNIGate != "" {
		gate = fmt.Sprintf(`,
    {
      "type": %q,
      "socket": %q,
      "timeout": %q
    }`, podgate.PluginName, ns.netpolSocket(), podgate.DefaultTimeout.String())
	}
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "socialweb-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "mtu": %d,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "dataDir": %q
      }
    }%s
  ]
}
`, podBridge, podnet.MTU, subnet, ns.work("cni", "ipam"), gate)
}

// cniBinDir is where the node's containerd finds its CNI plugins: with the gate, a dir of
// the node's own linking the host's plugins and the gate's binary under its plugin name.
func (ns nodeState) cniBinDir() string {
	if ns.CNIGate == "" {
		return CNIBinDir
	}
	return ns.work("cni", "bin")
}

// netpolSocket is where the node's NetworkPolicy process serves the gate.
func (ns nodeState) netpolSocket() string { return filepath.Join(ns.RunDir, "netpol.sock") }

// writeCNIBinDir makes cniBinDir's links (again at every start: the binaries' paths are the
// host's and may have moved with a new binary).
func writeCNIBinDir(ns nodeState) error {
	if ns.CNIGate == "" {
		return nil
	}
	dir := ns.cniBinDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	links := map[string]string{podgate.PluginName: ns.CNIGate}
	for _, p := range cniPlugins {
		links[p] = filepath.Join(CNIBinDir, p)
	}
	for name, target := range links {
		tmp := filepath.Join(dir, "."+name+".tmp")
		_ = os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// cniGateBeside is the gate's binary for a node of binary: the small one beside it when
// there is one to trust, else binary itself (it is the plugin under the plugin's name).
func cniGateBeside(binary string) string {
	if p := selfexe.Beside(binary, podgate.PluginName); p != "" {
		return p
	}
	return binary
}

// kubeletConfig: the settings this host needs (hybrid cgroup v1, no systemd: cgroupfs) and
// pod-level cgroups under the node's (cgroupsPerQOS: the root of the node's cgroup namespace
// is the node's own cgroup, so kubepods and every pod's cgroup sit inside its limits; an
// in-place resize changes a pod's cgroup) and nothing that reaches outside the node: no resolv.conf of the host
// (a pod's DNS is the node's own server on NodeLocalDNS, services.go),
// no read-only port, the API on the node's address, pod logs in the node's dir, evictions
// at thresholds a shared host does not trip. The join bundle's client certificate lives a
// day: the kubelet renews it through a CertificateSigningRequest (into its cert dir) before
// it expires, which the cluster approves and signs for the node's own name.
func kubeletConfig(ns nodeState) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupsPerQOS: true
cgroupRoot: /
cgroupDriver: cgroupfs
enforceNodeAllocatable: []
failSwapOn: false
resolvConf: ""
address: %s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
podLogsDir: %s
containerRuntimeEndpoint: unix://%s
imageServiceEndpoint: unix://%s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
registerNode: true
rotateCertificates: true
seccompDefault: true
enableSystemLogHandler: false
enableProfilingHandler: false
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`, ns.NodeIP, ns.work("pod-logs"), ns.sock(), ns.sock(), ns.secret(SecretCA)) + kubeletReserved(ns) + kubeletDNS(ns) + kubeletTaints(ns)
}

// kubeletTaints is the registerWithTaints stanza of the Join's taints, as JSON (which YAML
// reads as is, so no key or value is read as YAML of its own).
func kubeletTaints(ns nodeState) string {
	if len(ns.Taints) == 0 {
		return ""
	}
	b, err := json.Marshal(ns.Taints)
	if err != nil {
		return ""
	}
	return "registerWithTaints: " + string(b) + "\n"
}

// kubeletDNS points pods at the node's DNS server (services.go).
func kubeletDNS(ns nodeState) string {
	return fmt.Sprintf("clusterDNS: [%s]\nclusterDomain: %s\n", clusternet.NodeLocalDNS, clusternet.ClusterDomain)
}

// kubeletReserved is the systemReserved stanza that leaves ns's contract allocatable
// (allocatable.go); a host whose capacity cannot be read reserves nothing.
func kubeletReserved(ns nodeState) string {
	h, err := readHostCapacity()
	if err != nil {
		return ""
	}
	return systemReservedConfig(ns, h)
}

// deleteContainers force-deletes every container runc knows under the node's runc root
// (<run dir>/runc/<containerd namespace>/<id>): what is left when the agent could not remove
// the pods through the CRI (it was killed, or containerd died). runc kills the container's
// processes, which live in pid namespaces of their own and name none of the node's dirs.
func deleteContainers(ns nodeState) error {
	if ns.RunDir == "" {
		return nil
	}
	roots, _ := filepath.Glob(filepath.Join(ns.RunDir, "runc", "*"))
	var errs []error
	for _, root := range roots {
		ents, _ := os.ReadDir(root)
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			if out, err := exec.Command(ns.Runtime.path("runc"), "--root", root, "delete", "--force", e.Name()).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("runc delete %s: %v: %s", e.Name(), err, strings.TrimSpace(string(out))))
			}
		}
	}
	return errors.Join(errs...)
}
