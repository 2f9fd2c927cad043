package node

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"socialweb.computer/internal/clusternet"
	"socialweb.computer/internal/substrate/guestproc"
)

// A contained node (the namespace flavour) runs its containerd and kubelet, and with them
// every shim and container, in namespaces of its own besides the network one: mount, PID,
// IPC, UTS and cgroup. Process 1 of those namespaces is `socialweb node-root DIR`: it builds
// the node's root on a tmpfs (the binaries read-only, the node's own dirs read-write, proc,
// sysfs read-only, a /dev of a few character devices, the node's cgroups as the cgroup
// root), pivots into it, and then only reaps; the agent starts containerd and the kubelet
// into its namespaces with nsenter. The host's files outside the node's dirs (the data dir,
// the host's other guests) and the host's processes are not in that root or that PID
// namespace; when process 1 dies the kernel kills everything in the namespace, so a node
// cannot outlive it.

// rootReadyFile, in the node's run dir, says process 1 has pivoted into the node's root.
const rootReadyFile = "root.ready"

// VolumesDir is where, inside a contained node, the tenant cluster's local-path volumes are
// (internal/tenant/volumes.NodeDir, the same path).
const VolumesDir = "/var/lib/socialweb/volumes"

// volumesDir is the node's own dir that backs VolumesDir.
func (ns nodeState) volumesDir() string { return ns.work("volumes") }

// rootfs is where process 1 mounts the node's root before pivoting into it.
func (ns nodeState) rootfs() string { return filepath.Join(ns.RunDir, "rootfs") }

// kernelTunables are the sysctls the kubelet sets at start unless they already hold these
// values (k8s.io/kubernetes pkg/kubelet/cm setupKernelTunables). They are global to the host;
// a node's /proc/sys is read-only, so each is shown as a file holding the kubelet's value.
var kernelTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// fullProcDir is where a node of the node runtime has a proc without masks (buildRoot).
const fullProcDir = "run/swnode-proc"

// maskedProc are proc files a node has no use for and that reach the host's kernel as a
// whole (its memory, a reboot): /dev/null is mounted over each.
var maskedProc = []string{"kcore", "sysrq-trigger", "timer_list", "keys", "kallsyms"}

// droppedCaps leave the node's capability bounding set before containerd and the kubelet
// start: nothing a node does loads modules, reads raw I/O ports or memory, reboots, sets
// the clock, opens files by handle (the way out of a bind mount onto the host's file
// system) or changes security modules.
// The agent starts every process of the node through setpriv (a capability bounding set is
// a thread's, and the agent has many threads).
var droppedCaps = []string{
	"sys_module", "sys_rawio", "sys_boot", "sys_time", "dac_read_search", "mac_admin",
	"mac_override", "wake_alarm", "block_suspend", "audit_control", "sys_pacct", "sys_tty_config",
}

// nodeDevices are the character devices of a node's /dev: null, zero, full, random,
// urandom, tty, kmsg (the kubelet's OOM watcher reads it) and net/tun (the pod network's
// overlay device, made in the node's own network namespace).
var nodeDevices = []struct {
	name         string
	major, minor uint32
	mode         uint32
}{
	{"null", 1, 3, 0o666}, {"zero", 1, 5, 0o666}, {"full", 1, 7, 0o666}, {"random", 1, 8, 0o666},
	{"urandom", 1, 9, 0o666}, {"tty", 5, 0, 0o666}, {"kmsg", 1, 11, 0o600},
	{"net/tun", 10, 200, 0o600},
}

// deviceRules are the devices cgroup rules of a contained node, written after "a" is
// denied: creating device nodes is allowed (runc makes each container's /dev), reading and
// writing only the devices above and terminals (ptmx, pts, console) and tun. No block
// device: a process of the node cannot open the host's disks even as root.
var deviceRules = []string{
	"c *:* m", "b *:* m",
	"c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 1:11 rwm",
	"c 5:0 rwm", "c 5:1 rwm", "c 5:2 rwm", "c 136:* rwm", "c 10:200 rwm",
}

// RunRoot is process 1 of a contained node: it builds the node's root, pivots into it,
// marks it ready and reaps the orphans of the namespace until it is killed. It returns an
// exit status only when the root could not be built.
func RunRoot(dir string) int {
	var ns nodeState
	if err := guestproc.ReadJSON(filepath.Join(dir, nodeFile), &ns); err != nil {
		fmt.Fprintf(os.Stderr, "node-root: %v\n", err)
		return 2
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "node-root: not process 1 of a PID namespace (the agent starts it)")
		return 2
	}
	if err := buildRoot(ns); err != nil {
		fmt.Fprintf(os.Stderr, "node-root: %v\n", err)
		return 1
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD)
	// Signals from inside the namespace (a process that escaped a container) do not end it:
	// only the agent's SIGKILL from outside does.
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if err := os.WriteFile(filepath.Join(ns.RunDir, rootReadyFile), nil, 0o600); err != nil {
		fmt.Fprintf(os.Stderr, "node-root: %v\n", err)
		return 1
	}
	for range sigs {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
	return 0
}

// buildRoot makes the node's root at ns.rootfs() and pivots into it.
func buildRoot(ns nodeState) error {
	// Nothing mounted here reaches the host, and nothing the host mounts later reaches here.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	rf := ns.Root
	if rf == nil {
		top, err := rootTopFiles(ns.Binary, ns.Runtime)
		if err != nil {
			return err
		}
		resolved, err := resolveRootFiles(top)
		if err != nil {
			return err
		}
		rf = &resolved
	}
	files := append([][2]string(nil), rf.Files...)
	files[0][1] = ns.Binary // at its host path, as the agent names it (the vm disk's path differs)
	cgroups, err := hostCgroupMounts()
	if err != nil {
		return err
	}
	r := ns.rootfs()
	if err := os.MkdirAll(r, 0o700); err != nil {
		return err
	}
	m := &mounter{root: r}
	m.mount("tmpfs", "/", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=256m")
	for _, d := range []string{"bin", "etc", "root", "var/lib", "var/log", "proc", "sys", "dev", "run", "tmp"} {
		m.mkdir(d, 0o755)
	}
	m.symlink("../run", "var/run")
	m.mount("tmpfs", "run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=64m")
	m.mount("tmpfs", "tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size=64m")

	// What the node runs, read-only, at the host's paths; busybox's applets (mount, umount
	// for the kubelet) where no host file took the name.
	for _, f := range files {
		m.bindFile(f[0], f[1], true)
	}
	// The node runtime's dir whole, read-only: runc (>= 1.2) seals its own binary for each
	// container with an overlayfs whose lower dir is the binary's dir, and an overlay does
	// not see a file bound onto the root's tmpfs (it found the empty placeholder and every
	// container failed "fork/exec /proc/self/fd/6: permission denied").
	if ns.Runtime.Dir != "" {
		m.mkdir(ns.Runtime.Dir, 0o755)
		m.mount(ns.Runtime.Dir, ns.Runtime.Dir, "", unix.MS_BIND, "")
		m.remount(ns.Runtime.Dir, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV)
	}
	for _, a := range rf.Applets {
		if _, err := os.Lstat(filepath.Join(r, a)); err == nil {
			continue
		}
		m.mkdir(filepath.Dir(a), 0o755)
		m.symlink("/bin/busybox", a)
	}
	for name, body := range map[string]string{
		"passwd":        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"group":         "root:x:0:\nnogroup:x:65534:\n",
		"hosts":         "127.0.0.1 localhost\n",
		"nsswitch.conf": "hosts: files dns\n",
		// The node's own DNS server (services.go): containerd resolves registry names
		// through it, and it forwards them to the bidder's upstream.
		"resolv.conf": "nameserver " + clusternet.NodeLocalDNS + "\n",
		"hostname":    hostname(ns.NodeName) + "\n",
	} {
		m.writeFile("etc/"+name, body, 0o644)
	}

	// The node's own dirs, read-write: its guest dir (containerd's root, the kubelet's
	// dirs, pod logs, the join bundle) and its run dir (sockets, containerd's state, runc's
	// root).
	// With the node runtime, the path to the run dir may be passed (0711; not read): a pod in
	// a user namespace has its root under it, and its uid 0 is no owner of it (runc failed
	// "remount-propagation ... rootfs: permission denied").
	for _, d := range []string{ns.Dir, ns.RunDir} {
		dirMode := os.FileMode(0o700)
		if d == ns.RunDir && ns.Runtime.UserNamespaces() {
			dirMode = 0o711
		}
		m.mkdir(d, dirMode)
		m.mount(d, d, "", unix.MS_BIND, "")
	}
	// The node's disk, which the agent mounted on the work dir in the namespace this one
	// copies (disk.go): the bind of the guest dir above does not carry the mounts under it,
	// so without this the node would write to the host's file system beneath. The image
	// itself is masked: the node writes its disk through the file system only.
	if ns.DiskMiB > 0 {
		m.mount(ns.work(), ns.work(), "", unix.MS_BIND, "")
		m.mount("/dev/null", filepath.Join(ns.Dir, diskImage), "", unix.MS_BIND, "")
	}

	// The node's volumes (docs/volumes.md): its own dir work/volumes, read-write at the one
	// path the cluster's local-path volumes name. It goes with the work dir when the node is
	// released.
	if m.err == nil {
		m.err = os.MkdirAll(ns.volumesDir(), 0o700)
	}
	m.mkdir(VolumesDir, 0o755)
	m.mount(ns.volumesDir(), VolumesDir, "", unix.MS_BIND, "")

	// proc of the node's PID namespace; /proc/sys read-only but for net (the node's own
	// network namespace: the CNI bridge sets its forwarding there).
	m.mount("proc", "proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	// A proc the node's masks and read-only binds below do not cover, out of the way: the
	// kernel lets a user namespace (a pod's with hostUsers: false) mount a proc only when one
	// is fully visible in its mount namespace and no more restricted than the new one
	// (mount_too_revealing): runc failed every such pod "error mounting proc ... operation
	// not permitted". Read-write, as runc mounts a container's (a read-only one was not
	// enough). It shows the node's root nothing it could not mount itself (it keeps
	// CAP_SYS_ADMIN for its mounts): the masks are against mistakes, not the node's root.
	if ns.Runtime.UserNamespaces() {
		m.mkdir(fullProcDir, 0o700)
		m.mount("proc", fullProcDir, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	}
	m.mount(m.path("proc/sys"), "proc/sys", "", unix.MS_BIND|unix.MS_REC, "")
	m.mount(m.path("proc/sys/net"), "proc/sys/net", "", unix.MS_BIND, "")
	m.remount("proc/sys", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC)
	m.remount("proc/sys/net", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC)
	m.mkdir("run/swnode-sysctl", 0o755)
	for k, v := range kernelTunables {
		f := "run/swnode-sysctl/" + strings.ReplaceAll(k, "/", ".")
		m.writeFile(f, v+"\n", 0o444)
		m.bindFile(filepath.Join(r, f), "proc/sys/"+k, true)
	}
	for _, p := range maskedProc {
		if _, err := os.Stat("/proc/" + p); err == nil {
			m.mount("/dev/null", "proc/"+p, "", unix.MS_BIND, "")
		}
	}

	// sysfs of the node's network namespace, read-only; the cgroup hierarchies the host
	// has, each mounted anew: in the node's cgroup namespace their root is the node's cgroup,
	// so containerd puts every container's cgroup under it.
	m.mount("sysfs", "sys", "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	if len(cgroups) > 0 {
		m.mount("tmpfs", "sys/fs/cgroup", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755")
		for _, c := range cgroups {
			m.mkdir("sys/fs/cgroup/"+c.dir, 0o755)
			m.mount("cgroup", "sys/fs/cgroup/"+c.dir, c.fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, c.opts)
		}
		for link, target := range cgroupLinks(cgroups) {
			m.symlink(target, "sys/fs/cgroup/"+link)
		}
	}

	m.mount("tmpfs", "dev", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k")
	for _, d := range nodeDevices {
		if m.err == nil {
			p := filepath.Join(r, "dev", d.name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				m.err = err
			} else if err := unix.Mknod(p, unix.S_IFCHR|d.mode, int(unix.Mkdev(d.major, d.minor))); err != nil {
				m.err = fmt.Errorf("mknod %s: %w", p, err)
			} else {
				m.err = os.Chmod(p, os.FileMode(d.mode))
			}
		}
	}
	m.mkdir("dev/pts", 0o755)
	m.mkdir("dev/shm", 0o1777)
	m.mount("devpts", "dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
	m.mount("shm", "dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=64m")
	m.symlink("pts/ptmx", "dev/ptmx")
	m.symlink("/proc/self/fd", "dev/fd")
	for i, n := range []string{"stdin", "stdout", "stderr"} {
		m.symlink("/proc/self/fd/"+strconv.Itoa(i), "dev/"+n)
	}
	m.remount("/", unix.MS_NOSUID|unix.MS_NODEV)
	if m.err != nil {
		return m.err
	}

	old := filepath.Join(r, ".oldroot")
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	if err := unix.PivotRoot(r, old); err != nil {
		return fmt.Errorf("pivot_root %s: %w", r, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Unmount("/.oldroot", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount the host's root: %w", err)
	}
	if err := os.Remove("/.oldroot"); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(hostname(ns.NodeName))); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	return nil
}

// hostname is the node's name cut to a host name's 64 bytes.
func hostname(nodeName string) string {
	if len(nodeName) > 63 {
		return nodeName[:63]
	}
	return nodeName
}

// mounter builds a tree under root, keeping the first error.
type mounter struct {
	root string
	err  error
}

func (m *mounter) path(p string) string { return filepath.Join(m.root, p) }

func (m *mounter) mkdir(p string, mode os.FileMode) {
	if m.err == nil {
		m.err = os.MkdirAll(m.path(p), mode)
	}
}

func (m *mounter) symlink(target, p string) {
	if m.err == nil {
		if err := os.Symlink(target, m.path(p)); err != nil && !os.IsExist(err) {
			m.err = err
		}
	}
}

func (m *mounter) writeFile(p, body string, mode os.FileMode) {
	if m.err == nil {
		m.err = os.WriteFile(m.path(p), []byte(body), mode)
	}
}

// mount mounts source (a path on the host when fstype is empty) at p in the tree.
func (m *mounter) mount(source, p, fstype string, flags uintptr, data string) {
	if m.err != nil {
		return
	}
	if err := unix.Mount(source, m.path(p), fstype, flags, data); err != nil {
		m.err = fmt.Errorf("mount %s on %s: %w", source, m.path(p), err)
	}
}

// remount sets flags on the mount at p (a bind mount: only its own flags change).
func (m *mounter) remount(p string, flags uintptr) {
	if m.err != nil {
		return
	}
	if err := unix.Mount("", m.path(p), "", unix.MS_REMOUNT|unix.MS_BIND|flags, ""); err != nil {
		m.err = fmt.Errorf("remount %s: %w", m.path(p), err)
	}
}

// bindFile mounts the host file src over a new empty file at p in the tree.
func (m *mounter) bindFile(src, p string, readOnly bool) {
	if m.err != nil {
		return
	}
	dst := m.path(p)
	if _, err := os.Stat(dst); err != nil {
		if m.err = os.MkdirAll(filepath.Dir(dst), 0o755); m.err != nil {
			return
		}
		if m.err = os.WriteFile(dst, nil, 0o444); m.err != nil {
			return
		}
	}
	m.mount(src, p, "", unix.MS_BIND, "")
	if readOnly {
		m.remount(p, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV)
	}
}

// cgroupMount is a cgroup hierarchy of the host: its dir under /sys/fs/cgroup, file system
// type and the options naming its controllers.
type cgroupMount struct{ dir, fstype, opts string }

// hostCgroupMounts lists the host's cgroup hierarchies mounted under /sys/fs/cgroup.
func hostCgroupMounts() ([]cgroupMount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return parseCgroupMounts(string(b)), nil
}

// parseCgroupMounts reads the cgroup and cgroup2 mounts under /sys/fs/cgroup from
// mountinfo: each v1 hierarchy's options keep only its controllers (and name=).
func parseCgroupMounts(mountinfo string) []cgroupMount {
	var out []cgroupMount
	seen := map[string]bool{}
	for _, line := range strings.Split(mountinfo, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		mp := unescapeMount(f[4])
		dir, ok := strings.CutPrefix(mp, "/sys/fs/cgroup/")
		if !ok || strings.Contains(dir, "/") || seen[dir] {
			continue
		}
		switch g[0] {
		case "cgroup2":
			out = append(out, cgroupMount{dir: dir, fstype: "cgroup2"})
		case "cgroup":
			var opts []string
			for _, o := range strings.Split(g[2], ",") {
				switch {
				case o == "rw" || o == "ro" || o == "relatime" || o == "noatime" || o == "nosuid" || o == "nodev" || o == "noexec":
				case strings.HasPrefix(o, "release_agent="):
				default:
					opts = append(opts, o)
				}
			}
			out = append(out, cgroupMount{dir: dir, fstype: "cgroup", opts: strings.Join(opts, ",")})
		default:
			continue
		}
		seen[dir] = true
	}
	return out
}

// cgroupLinks are the links a host makes for a hierarchy of several controllers
// (cpu -> cpu,cpuacct): each controller of a joint hierarchy that has no dir of its own.
func cgroupLinks(ms []cgroupMount) map[string]string {
	have := map[string]bool{}
	for _, c := range ms {
		have[c.dir] = true
	}
	links := map[string]string{}
	for _, c := range ms {
		if c.fstype != "cgroup" || !strings.Contains(c.dir, ",") {
			continue
		}
		for _, name := range strings.Split(c.dir, ",") {
			if !have[name] {
				links[name] = c.dir
			}
		}
	}
	return links
}

// startRoot starts process 1 of the node's namespaces (in the node's network namespace,
// new mount, PID, IPC, UTS and cgroup namespaces) and waits until it says its root is
// ready. Its output goes to the agent's.
func (a *agent) startRoot() error {
	ns := a.ns
	_ = os.Remove(filepath.Join(ns.RunDir, rootReadyFile))
	argv := withoutCaps("nsenter", "--net="+ns.netnsPath(), "--", ns.Binary, "node-root", ns.Dir)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP,
		// If the agent dies, so does the node: process 1's end kills every process of it.
		Pdeathsig: syscall.SIGKILL,
		Setpgid:   true,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the node's root: %w", err)
	}
	a.root = cmd
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		exited <- err
		a.ended <- fmt.Sprintf("the node's process 1 ended: %v", err)
	}()
	deadline := time.After(15 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(ns.RunDir, rootReadyFile)); err == nil {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the node's root: process 1 ended: %v (its error is above)", err)
		case <-deadline:
			return errors.New("the node's root was not ready within 15s")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// enterArgv is argv run inside the node's namespaces (those of process 1, pid), without
// the dropped capabilities.
func enterArgv(pid int, argv []string) []string {
	return withoutCaps(append([]string{"nsenter", "--target", strconv.Itoa(pid),
		"--mount", "--pid", "--ipc", "--uts", "--net", "--cgroup", "--"}, argv...)...)
}

// withoutCaps is argv run with droppedCaps out of its capability bounding set.
func withoutCaps(argv ...string) []string {
	drop := make([]string, len(droppedCaps))
	for i, c := range droppedCaps {
		drop[i] = "-" + c
	}
	return append([]string{"setpriv", "--bounding-set", strings.Join(drop, ","), "--"}, argv...)
}
