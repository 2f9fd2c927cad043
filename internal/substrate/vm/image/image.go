// Package image builds and loads the kernel+initramfs pair that the vm
// substrate boots: the kernel of Debian's linux-image-cloud-amd64, and an
// initramfs written here (busybox from Debian's busybox-static, the virtio
// net modules of that kernel, and the guest init in init.sh).
package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"socialweb.computer/internal/atomicfile"
)

// Files in an image directory.
const (
	KernelFile   = "vmlinuz"
	InitrdFile   = "initrd.gz"
	ManifestFile = "image.json"
	// PVHKernelFile is the uncompressed kernel ELF, booted through its PVH
	// entry when the build could extract it (ExtractVmlinux).
	PVHKernelFile = "vmlinux"
)

// KernelMetaPackage is the Debian package whose dependency names the kernel.
const KernelMetaPackage = "linux-image-cloud-amd64"

// BusyboxPackage is the Debian package that provides the guest's userland.
const BusyboxPackage = "busybox-static"

// NetModules are the modules that give a microvm guest its virtio net
// device, in load order.
var NetModules = []string{"virtio_ring", "virtio", "virtio_mmio", "failover", "net_failover", "virtio_net"}

// NodeModules are carried in the initramfs, with what they depend on, for the node
// substrate's vm flavour, which loads them in the order of NodeModuleOrderFile: its disks
// (virtio_blk), the CNI bridge and the pods' veth pairs, containerd's overlay snapshots,
// the pod network's overlay (tun), and the netfilter of kube-proxy's rules (iptables-nft:
// nf_tables with the xtables matches and targets of k8s.io/kubernetes pkg/proxy/iptables,
// as the node's iptables extensions, rootdisk.go), of the node's NetworkPolicy (nftables,
// internal/netpol) and of its masquerade (internal/podnet). br_netfilter puts bridged pod
// traffic through them. Other guests leave them unloaded.
var NodeModules = []string{
	"virtio_blk", "bridge", "veth", "overlay", "tun", "br_netfilter",
	"nf_tables", "nft_compat", "nft_ct", "nft_chain_nat", "nft_nat", "nft_masq", "nft_reject_inet",
	"nf_conntrack_netlink", "xt_conntrack", "xt_comment", "xt_statistic", "xt_addrtype",
	"xt_mark", "xt_MASQUERADE", "xt_nat", "xt_multiport", "xt_recent", "xt_nfacct",
	"xt_tcpudp", "xt_state", "xt_sctp", "ipt_REJECT", "ip6t_REJECT",
}

//go:embed init.sh
var initScript []byte

// Manifest describes a built image; it is written as image.json.
type Manifest struct {
	KernelPackage  string `json:"kernelPackage"`
	KernelVersion  string `json:"kernelVersion"`  // Debian package version
	KernelRelease  string `json:"kernelRelease"`  // uname -r of the guest
	BusyboxVersion string `json:"busyboxVersion"` // Debian package version
	// NodeModules lists the modules of NodeModules the initramfs carries (images built
	// before they were added carry none, and cannot boot a node).
	NodeModules     []string  `json:"nodeModules,omitempty"`
	KernelSHA256    string    `json:"kernelSHA256"`
	PVHKernelSHA256 string    `json:"pvhKernelSHA256,omitempty"`
	InitrdSHA256    string    `json:"initrdSHA256"`
	BuiltAt         time.Time `json:"builtAt"`
}

// CarriesNodeModules says whether the image's initramfs has every module of NodeModules,
// which a vm-flavoured node loads.
func (m Manifest) CarriesNodeModules() bool { return slices.Equal(m.NodeModules, NodeModules) }

// Image is a built image on disk.
type Image struct {
	Dir    string
	Kernel string // path of vmlinuz
	// PVHKernel is the path of vmlinux, "" when the image has none; the vm
	// substrate boots it in preference to Kernel.
	PVHKernel string
	Initrd    string // path of initrd.gz
	Manifest  Manifest
}

// ErrNoImage is returned by Load when the directory holds no complete image.
var ErrNoImage = errors.New("no vm image (build one with `socialweb image build`)")

// Load reads the image in dir.
func Load(dir string) (Image, error) {
	im := Image{Dir: dir, Kernel: filepath.Join(dir, KernelFile), Initrd: filepath.Join(dir, InitrdFile)}
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return im, fmt.Errorf("%s: %w", dir, ErrNoImage)
		}
		return im, err
	}
	if err := json.Unmarshal(b, &im.Manifest); err != nil {
		return im, fmt.Errorf("%s: bad %s: %w", dir, ManifestFile, err)
	}
	for _, p := range []string{im.Kernel, im.Initrd} {
		if _, err := os.Stat(p); err != nil {
			return im, fmt.Errorf("%s: %w", p, ErrNoImage)
		}
	}
	if im.Manifest.PVHKernelSHA256 != "" {
		p := filepath.Join(dir, PVHKernelFile)
		if _, err := os.Stat(p); err != nil {
			return im, fmt.Errorf("%s: %w", p, ErrNoImage)
		}
		im.PVHKernel = p
	}
	return im, nil
}

// Prerequisites reports the host tools BuildImage needs that are missing.
func Prerequisites() []string {
	var missing []string
	for _, t := range []string{"apt-get", "apt-cache", "dpkg-deb"} {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	return missing
}

// BuildImage makes the kernel+initramfs pair in outDir (vmlinuz, initrd.gz,
// image.json), printing its phases and progress to progress (nil for none).
// It downloads two Debian packages with `apt-get download` into a scratch
// directory under outDir and unpacks them with `dpkg-deb -x`: nothing is
// installed on the host. The files are replaced atomically, so a running
// guest keeps the image it booted.
func BuildImage(ctx context.Context, outDir string, progress io.Writer) error {
	if progress == nil {
		progress = io.Discard
	}
	if m := Prerequisites(); len(m) > 0 {
		return fmt.Errorf("image build needs %s (Debian's apt and dpkg)", strings.Join(m, ", "))
	}
	start := time.Now()
	const phases = 5
	phase := func(i int, name, detail string) func() {
		t := time.Now()
		fmt.Fprintf(progress, "[%d/%d] %s: %s\n", i, phases, name, detail)
		return func() {
			fmt.Fprintf(progress, "[%d/%d] %s: done in %s\n", i, phases, name, time.Since(t).Round(time.Millisecond))
		}
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	scratch, err := os.MkdirTemp(outDir, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	// apt-get download drops privileges to _apt, which must be able to
	// write into the download directory.
	_ = os.Chmod(scratch, 0o777)

	done := phase(1, "resolve", "which kernel package "+KernelMetaPackage+" depends on")
	kpkg, err := resolveKernelPackage(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(progress, "       kernel package %s\n", kpkg)
	done()

	done = phase(2, "download", kpkg+" "+BusyboxPackage+" (apt-get download)")
	debs, err := aptDownload(ctx, scratch, progress, kpkg, BusyboxPackage)
	if err != nil {
		return err
	}
	done()

	done = phase(3, "extract", "dpkg-deb -x")
	kdir := filepath.Join(scratch, "kernel")
	bdir := filepath.Join(scratch, "busybox")
	for deb, dir := range map[string]string{debs[kpkg]: kdir, debs[BusyboxPackage]: bdir} {
		if err := run(ctx, nil, "dpkg-deb", "-x", deb, dir); err != nil {
			return err
		}
	}
	m := Manifest{KernelPackage: kpkg}
	if m.KernelVersion, err = debField(ctx, debs[kpkg], "Version"); err != nil {
		return err
	}
	if m.BusyboxVersion, err = debField(ctx, debs[BusyboxPackage], "Version"); err != nil {
		return err
	}
	kernels, _ := filepath.Glob(filepath.Join(kdir, "boot", "vmlinuz-*"))
	if len(kernels) != 1 {
		return fmt.Errorf("%s: expected one boot/vmlinuz-*, found %d", kpkg, len(kernels))
	}
	m.KernelRelease = strings.TrimPrefix(filepath.Base(kernels[0]), "vmlinuz-")
	done()

	done = phase(4, "initramfs", "busybox "+m.BusyboxVersion+", modules "+strings.Join(NetModules, " ")+" and the node's (node.order)")
	ar, err := baseArchive(filepath.Join(bdir, "bin", "busybox"), filepath.Join(kdir, "lib", "modules", m.KernelRelease))
	if err != nil {
		return err
	}
	var initrd bytes.Buffer
	if err := ar.WriteGzip(&initrd); err != nil {
		return err
	}
	fmt.Fprintf(progress, "       initrd.gz %d KiB\n", initrd.Len()/1024)
	done()

	done = phase(5, "write", outDir)
	kernel, err := os.ReadFile(kernels[0])
	if err != nil {
		return err
	}
	m.NodeModules = NodeModules
	m.KernelSHA256 = sum(kernel)
	m.InitrdSHA256 = sum(initrd.Bytes())
	files := map[string][]byte{KernelFile: kernel, InitrdFile: initrd.Bytes()}
	if vmlinux, err := ExtractVmlinux(kernel); err != nil {
		fmt.Fprintf(progress, "       no PVH kernel (%v): guests boot vmlinuz\n", err)
		_ = os.Remove(filepath.Join(outDir, PVHKernelFile))
	} else {
		m.PVHKernelSHA256 = sum(vmlinux)
		files[PVHKernelFile] = vmlinux
		fmt.Fprintf(progress, "       vmlinux %.1f MB (PVH entry: no decompression at boot)\n", float64(len(vmlinux))/1e6)
	}
	m.BuiltAt = time.Now().UTC().Truncate(time.Second)
	manifest, _ := json.MarshalIndent(m, "", "  ")
	for name, data := range files {
		if err := atomicfile.Write(filepath.Join(outDir, name), data, 0o644); err != nil {
			return err
		}
	}
	// The manifest last: its presence marks a complete image.
	if err := atomicfile.Write(filepath.Join(outDir, ManifestFile), append(manifest, '\n'), 0o644); err != nil {
		return err
	}
	done()
	fmt.Fprintf(progress, "image: kernel %s (%s), initrd %d KiB in %s, built in %s\n",
		m.KernelRelease, m.KernelVersion, initrd.Len()/1024, outDir, time.Since(start).Round(time.Millisecond))
	return nil
}

// baseArchive assembles the initramfs: /init, busybox with a link per
// applet, the net modules flattened into /lib/modules, /dev/console.
func baseArchive(busybox, modDir string) (*Archive, error) {
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	ar := NewArchive()
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "run", "etc", "root", "lib/modules"} {
		ar.Add(Entry{Name: d, Kind: Dir, Mode: 0o755})
	}
	ar.Add(Entry{Name: "dev/console", Kind: CharDev, Mode: 0o600, DevMajor: 5, DevMinor: 1})
	ar.Add(Entry{Name: "dev/null", Kind: CharDev, Mode: 0o666, DevMajor: 1, DevMinor: 3})
	ar.Add(Entry{Name: "bin/busybox", Kind: File, Mode: 0o755, Data: bb})
	ar.Add(Entry{Name: "init", Kind: File, Mode: 0o755, Data: initScript})
	ar.Add(Entry{Name: "etc/passwd", Kind: File, Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\n")})
	ar.Add(Entry{Name: "etc/group", Kind: File, Mode: 0o644, Data: []byte("root:x:0:\n")})
	// busybox-static runs on the (amd64) build host: ask it for its applets.
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		p := strings.TrimSpace(sc.Text())
		if p == "" || p == "bin/busybox" {
			continue
		}
		ar.Add(Entry{Name: p, Kind: Symlink, Link: "/bin/busybox"})
	}
	paths := map[string]string{}
	err = filepath.WalkDir(modDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if name, ok := strings.CutSuffix(d.Name(), ".ko"); ok {
			paths[name] = p
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	read := func(m string) ([]byte, error) {
		p, ok := paths[m]
		if !ok {
			return nil, fmt.Errorf("kernel modules: %s.ko not found under %s", m, modDir)
		}
		return os.ReadFile(p)
	}
	nodeOrder, err := loadOrder(NodeModules, NetModules, func(m string) ([]string, error) {
		data, err := read(m)
		if err != nil {
			return nil, err
		}
		return moduleDepends(data)
	})
	if err != nil {
		return nil, err
	}
	for _, m := range append(slices.Clone(NetModules), nodeOrder...) {
		data, err := read(m)
		if err != nil {
			return nil, err
		}
		ar.Add(Entry{Name: "lib/modules/" + m + ".ko", Kind: File, Mode: 0o644, Data: data})
	}
	ar.Add(Entry{Name: NodeModuleOrderFile, Kind: File, Mode: 0o644, Data: []byte(strings.Join(nodeOrder, "\n") + "\n")})
	return ar, nil
}

func resolveKernelPackage(ctx context.Context) (string, error) {
	var out bytes.Buffer
	if err := run(ctx, &out, "apt-cache", "depends", "--no-recommends", "--no-suggests", KernelMetaPackage); err != nil {
		return "", fmt.Errorf("%w (run hack/install-guest-deps.sh, which runs apt-get update)", err)
	}
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("apt-cache depends %s names no linux-image-* package (run apt-get update)", KernelMetaPackage)
}

func aptDownload(ctx context.Context, dir string, progress io.Writer, pkgs ...string) (map[string]string, error) {
	t := time.Now()
	cmd := exec.CommandContext(ctx, "apt-get", append([]string{"download", "-q"}, pkgs...)...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("apt-get download %s: %w\n%s", strings.Join(pkgs, " "), err, strings.TrimSpace(out.String()))
	}
	debs := map[string]string{}
	var total int64
	for _, p := range pkgs {
		m, _ := filepath.Glob(filepath.Join(dir, p+"_*.deb"))
		if len(m) != 1 {
			return nil, fmt.Errorf("apt-get download %s: expected one .deb, found %d", p, len(m))
		}
		debs[p] = m[0]
		if fi, err := os.Stat(m[0]); err == nil {
			total += fi.Size()
			fmt.Fprintf(progress, "       %s %.1f MB\n", filepath.Base(m[0]), float64(fi.Size())/1e6)
		}
	}
	secs := time.Since(t).Seconds()
	fmt.Fprintf(progress, "       %.1f MB in %.1fs (%.1f MB/s)\n", float64(total)/1e6, secs, float64(total)/1e6/max(secs, 0.001))
	return debs, nil
}

func debField(ctx context.Context, deb, field string) (string, error) {
	var out bytes.Buffer
	if err := run(ctx, &out, "dpkg-deb", "-f", deb, field); err != nil {
		return "", err
	}
	return strings.TrimSpace(out.String()), nil
}

func run(ctx context.Context, stdout io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var errb bytes.Buffer
	cmd.Stdout = stdout
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return nil
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
