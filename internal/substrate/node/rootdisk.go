package node

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"socialweb.computer/internal/netpol/podgate"
)

// The vm flavour's root disk: one read-only ext4 file system shared by every vm node of a
// state dir, holding what a node runs (the socialweb binary, containerd and its runc shim,
// runc, ctr, nft for the NetworkPolicy rules, the CNI plugins, busybox) with the shared
// libraries they load, at the paths the host has them. It is built from the host's own files
// with mkfs.ext4 -d (no mount, no loop device) and kept under a name that hashes those
// files, so a new binary makes a new disk.

// Labels of the vm flavour's disks: the guest finds them by label, not by probe order.
const (
	rootDiskLabel  = "swnode-root"
	stateDiskLabel = "swnode-state"
)

// Paths inside a vm node.
// The state disk is the guest's /var/lib, so what the kubelet, containerd and the CNI plugins
// keep there whatever their flags say (device-plugins, the CNI result cache) is written too;
// /var/log, /run and /tmp are tmpfs.
const (
	guestBinary = "/usr/local/bin/socialweb"
	// guestCNIGate is the gate plugin's binary (the host's may be under /tmp, which the
	// guest mounts over).
	guestCNIGate  = "/usr/local/bin/" + podgate.PluginName
	guestVarLib   = "/var/lib"
	guestStateDir = guestVarLib + "/socialweb"
)

// rootFiles is what a node's root is made of: the host files it runs, each as {host path,
// path in the node}, with the shared libraries they load, and busybox's applets.
type rootFiles struct {
	Files   [][2]string `json:"files"`
	Applets []string    `json:"applets"`
}

// rootFilesCache keeps the last rootFiles made, under the stat of the files named before
// their libraries: resolving the libraries runs ldd once per file (0.15-0.25 s in all on an
// idle host, more under load), which a node's boot would otherwise pay each time. A changed
// binary, runtime or iptables changes the key; a library replaced in place keeps its path.
type rootFilesCache struct {
	mu  sync.Mutex
	key string
	val rootFiles
}

// get returns the root's files for binary and rt, resolving them only when the key changed.
func (c *rootFilesCache) get(binary string, rt nodeRuntime) (rootFiles, error) {
	top, err := rootTopFiles(binary, rt)
	if err != nil {
		return rootFiles{}, err
	}
	key, err := rootDiskKey(top)
	if err != nil {
		return rootFiles{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if key == c.key {
		return c.val, nil
	}
	rf, err := resolveRootFiles(top)
	if err != nil {
		return rootFiles{}, err
	}
	c.key, c.val = key, rf
	return rf, nil
}

// resolveRootFiles adds to the top files the libraries they load, and lists busybox's
// applets.
func resolveRootFiles(top [][2]string) (rootFiles, error) {
	files, err := withSharedLibs(top)
	if err != nil {
		return rootFiles{}, err
	}
	out, err := exec.Command(BusyboxStatic, "--list-full").Output()
	if err != nil {
		return rootFiles{}, fmt.Errorf("busybox --list-full: %w", err)
	}
	return rootFiles{Files: files, Applets: strings.Fields(string(out))}, nil
}

// rootTopFiles are the host files a node runs, without their libraries: the first is the
// socialweb binary.
func rootTopFiles(binary string, rt nodeRuntime) ([][2]string, error) {
	files := [][2]string{{binary, guestBinary}, {BusyboxStatic, "/bin/busybox"}}
	if rt.Dir == "" { // the node runtime's dir is bound whole (buildRoot)
		rtFiles, err := rt.files()
		if err != nil {
			return nil, err
		}
		files = append(files, rtFiles...)
	}
	for _, b := range []string{"nft"} {
		p, err := exec.LookPath(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b, err)
		}
		files = append(files, [2]string{p, p})
	}
	for _, p := range cniPlugins {
		files = append(files, [2]string{filepath.Join(CNIBinDir, p), filepath.Join(CNIBinDir, p)})
	}
	if g := cniGateBeside(binary); g != binary {
		// At its host path for a contained node, at a path of its own for a vm guest.
		files = append(files, [2]string{g, g}, [2]string{g, guestCNIGate})
	}
	// kube-proxy's iptables (iptables-restore and iptables-save are the same multi-call
	// binary under their names) and the extensions its rules load (dlopen: ldd does not
	// see them).
	for _, b := range []string{"iptables", "iptables-restore", "iptables-save"} {
		p, err := exec.LookPath(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b, err)
		}
		files = append(files, [2]string{p, p})
	}
	xt, err := xtablesDir()
	if err != nil {
		return nil, err
	}
	for _, e := range xtablesExtensions {
		files = append(files, [2]string{filepath.Join(xt, e), filepath.Join(xt, e)})
	}
	return files, nil
}

// withSharedLibs is files followed by the libraries ldd resolves for them, each once, and
// the host's CA bundle (containerd verifies registries' certificates with it).
func withSharedLibs(top [][2]string) ([][2]string, error) {
	files := append([][2]string(nil), top...)
	seen := map[string]bool{}
	for _, f := range top {
		libs, err := sharedLibs(f[0])
		if err != nil {
			return nil, err
		}
		for _, l := range libs {
			if !seen[l] {
				seen[l] = true
				files = append(files, [2]string{l, l})
			}
		}
	}
	if _, err := os.Stat(CABundle); err == nil {
		files = append(files, [2]string{CABundle, CABundle})
	}
	return files, nil
}

// cniPlugins are the host's CNI plugins a node runs.
var cniPlugins = []string{"bridge", "host-local", "loopback"}

// xtablesExtensions are the iptables extensions kube-proxy's rules use (k8s.io/kubernetes
// pkg/proxy/iptables: matches, targets, the protocols of Services).
var xtablesExtensions = []string{
	"libxt_standard.so", "libxt_tcp.so", "libxt_udp.so", "libxt_sctp.so", "libxt_multiport.so",
	"libxt_addrtype.so", "libxt_comment.so", "libxt_conntrack.so", "libxt_state.so",
	"libxt_mark.so", "libxt_MARK.so", "libxt_nfacct.so", "libxt_recent.so", "libxt_statistic.so",
	"libxt_NAT.so", "libxt_DNAT.so", "libxt_SNAT.so", "libxt_MASQUERADE.so", "libipt_REJECT.so",
}

// xtablesDir is where this host's iptables finds its extensions.
func xtablesDir() (string, error) {
	cands, _ := filepath.Glob("/usr/lib/*/xtables")
	cands = append(cands, "/usr/lib/xtables", "/usr/libexec/xtables")
	for _, d := range cands {
		if _, err := os.Stat(filepath.Join(d, "libxt_standard.so")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("iptables extensions (libxt_standard.so) not found under /usr/lib/*/xtables: install iptables")
}

// CABundle is where Debian's ca-certificates puts the bundle Go's TLS reads.
const CABundle = "/etc/ssl/certs/ca-certificates.crt"

// sharedLibs lists the libraries ldd resolves for path (none for a static binary).
func sharedLibs(path string) ([]string, error) {
	out, err := exec.Command("ldd", path).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) || bytes.Contains(out, []byte("statically linked")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", path, err, strings.TrimSpace(string(out)))
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0]) // the dynamic loader
		}
	}
	return libs, nil
}

// rootDiskKey hashes what the disk is made of: each file's path, size and modification
// time, and this layout's version.
func rootDiskKey(files [][2]string) (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, "node-root v1")
	for _, f := range files {
		fi, err := os.Stat(f[0])
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %s %d %d\n", f[0], f[1], fi.Size(), fi.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// ensureRootDisk returns the root disk of rf's files under dir, building it when missing;
// disks of other keys are removed (no node boots from them once a new one exists: a running
// vm keeps its open file).
func ensureRootDisk(ctx context.Context, dir string, rf rootFiles) (string, error) {
	files := rf.Files
	key, err := rootDiskKey(files)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "node-root-"+key+".ext4")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	stage, err := os.MkdirTemp(dir, ".root-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(stage)
	var total int64
	for _, f := range files {
		n, err := copyInto(stage, f[0], f[1])
		if err != nil {
			return "", err
		}
		total += n
	}
	// busybox's applets, where the host's files did not take the name.
	for _, a := range rf.Applets {
		p := filepath.Join(stage, a)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.Symlink("/bin/busybox", p); err != nil {
			return "", err
		}
	}
	for _, d := range []string{"proc", "sys", "dev", "run", "tmp", "root", "etc", "var/lib", "var/log"} {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			return "", err
		}
	}
	_ = os.Symlink("../run", filepath.Join(stage, "var", "run"))
	etc := map[string]string{
		"passwd":        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"group":         "root:x:0:\nnogroup:x:65534:\n",
		"hosts":         "127.0.0.1 localhost\n",
		"nsswitch.conf": "hosts: files\n",
		"resolv.conf":   "",
	}
	for name, body := range etc {
		if err := os.WriteFile(filepath.Join(stage, "etc", name), []byte(body), 0o644); err != nil {
			return "", err
		}
	}
	// Room for the files, the file system's own metadata, and nothing else: the disk is
	// read-only in the guest.
	size := total + total/8 + 64<<20
	tmp := path + ".tmp"
	if err := makeExt4(ctx, tmp, rootDiskLabel, stage, size); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	old, _ := filepath.Glob(filepath.Join(dir, "node-root-*.ext4"))
	for _, o := range old {
		if o != path {
			_ = os.Remove(o)
		}
	}
	return path, nil
}

// makeExt4 writes an ext4 file system of size bytes at path, labelled, holding the tree
// under from (owned by root in the image whoever runs this).
func makeExt4(ctx context.Context, path, label, from string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", label, "-m", "0",
		"-E", "root_owner=0:0", "-d", from, path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %v: %s", filepath.Base(path), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copyInto copies the host file from to stage+to (following links), keeping its mode.
func copyInto(stage, from, to string) (int64, error) {
	dst := filepath.Join(stage, to)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return 0, err
	}
	in, err := os.Open(from)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return 0, err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, fi.Mode().Perm())
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// stateDiskSize is the size of each vm node's state disk (sparse: it takes what the node
// writes): containerd's images and snapshots, the kubelet's dirs, the pods' logs.
const stateDiskSize = 8 << 30

// writeStateDisk makes the node's state disk at path from the tree under seed.
func writeStateDisk(ctx context.Context, path, seed string) error {
	return makeExt4(ctx, path, stateDiskLabel, seed, stateDiskSize)
}

// sortedGlob is filepath.Glob, sorted.
func sortedGlob(pattern string) []string {
	m, _ := filepath.Glob(pattern)
	sort.Strings(m)
	return m
}
