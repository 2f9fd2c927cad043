package hostcheck

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"socialweb.computer/internal/denodist"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/jail"
	"socialweb.computer/internal/substrate/vm/image"
)

// Host is what Check decides from: facts about one machine, read by Probe (or written by
// hand in tests).
type Host struct {
	EUID   int
	Kernel string // release, /proc/sys/kernel/osrelease
	// Tools maps each of AllTools to its path on PATH ("" or absent: not found).
	Tools map[string]string
	// Files holds each of AllFiles that exists.
	Files map[string]bool
	// Namespaces are the kinds under /proc/self/ns (mnt, pid, user, net, ...).
	Namespaces []string
	Cgroups    Cgroups
	KVM        KVM
	Deno       Deno
	VMImage    VMImage
	// NodeRuntime is the node runtime directory that would be used: --node-runtime's, else
	// node-runtime beside the binary; Missing is the first runtime binary it lacks.
	NodeRuntime NodeRuntime
	// Addresses are the IP addresses on this host's interfaces.
	Addresses []string
	// RegistryConfigDir: Config.RegistryConfig is a directory.
	RegistryConfigDir bool
}

// Cgroups is the cgroup layout and whether the jail's probe finds memory, cpu and pids.
type Cgroups struct {
	Layout string // "v2", "v1", "hybrid (v1, cgroup2 at /sys/fs/cgroup/unified)"
	Err    string // jail.ProbeCgroups' error
}

// KVM is whether /dev/kvm opens read-write.
type KVM struct {
	Usable bool
	Err    string
}

// Deno is the deno binary the deno substrate would run, and where it was found.
type Deno struct {
	Path  string
	Where string // "$SOCIALWEB_DENO", "the project's .cache/deno", "PATH"
	Err   string
}

// VMImage is the image in Config.VMImage.
type VMImage struct {
	Dir         string
	Present     bool
	NodeModules bool
	Err         string
}

// NodeRuntime is a node runtime directory and the first binary it lacks ("" none).
type NodeRuntime struct {
	Dir     string
	Missing string
}

// CgroupRoot is where the cgroup file systems are.
const CgroupRoot = "/sys/fs/cgroup"

// Probe reads this host: PATH, fixed paths, /proc, /sys/fs/cgroup, /dev/kvm, the vm image
// and node runtime directories of c. It starts nothing and writes nothing.
func Probe(c Config) Host {
	h := Host{EUID: os.Geteuid(), Tools: map[string]string{}, Files: map[string]bool{}}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = strings.TrimSpace(string(b))
	}
	for _, t := range AllTools() {
		if p, err := exec.LookPath(t); err == nil {
			h.Tools[t] = p
		}
	}
	for _, f := range AllFiles() {
		if fi, err := os.Stat(f); err == nil && fi.Mode().IsRegular() {
			h.Files[f] = true
		}
	}
	if ents, err := os.ReadDir("/proc/self/ns"); err == nil {
		for _, e := range ents {
			h.Namespaces = append(h.Namespaces, e.Name())
		}
	}
	h.Cgroups = probeCgroups()
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		h.KVM.Err = err.Error()
	} else {
		f.Close()
		h.KVM.Usable = true
	}
	h.Deno = probeDeno()
	h.VMImage = probeImage(c.VMImage)
	h.NodeRuntime = probeRuntime(c.NodeRuntime)
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				h.Addresses = append(h.Addresses, n.IP.String())
			}
		}
	}
	if c.RegistryConfig != "" {
		fi, err := os.Stat(c.RegistryConfig)
		h.RegistryConfigDir = err == nil && fi.IsDir()
	}
	return h
}

func probeCgroups() Cgroups {
	var c Cgroups
	switch {
	case exists(filepath.Join(CgroupRoot, "cgroup.controllers")):
		c.Layout = "v2"
	case exists(filepath.Join(CgroupRoot, "unified", "cgroup.controllers")):
		c.Layout = "hybrid (v1, cgroup2 at " + filepath.Join(CgroupRoot, "unified") + ")"
	default:
		c.Layout = "v1"
	}
	if _, err := jail.ProbeCgroups(CgroupRoot, "socialweb-guests"); err != nil {
		c.Err = err.Error()
	}
	return c
}

// probeDeno is deno.DefaultBinary, with where it found the binary.
func probeDeno() Deno {
	p := deno.DefaultBinary()
	if p == "" {
		return Deno{}
	}
	d := Deno{Path: p, Where: "PATH"}
	switch {
	case os.Getenv(deno.EnvDeno) != "":
		d.Where = "$" + deno.EnvDeno
	case strings.Contains(p, "/.cache/deno/"):
		d.Where = "the project's .cache/deno"
	case p == denodist.InstalledBinary():
		d.Where = "the pinned one in the user's cache"
	}
	if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		d.Path, d.Err = "", p+" ("+d.Where+") is not an executable file"
	}
	return d
}

func probeImage(dir string) VMImage {
	v := VMImage{Dir: dir}
	if dir == "" {
		v.Err = "no --vm-image"
		return v
	}
	im, err := image.Load(dir)
	if err != nil {
		v.Err = err.Error()
		return v
	}
	v.Present, v.NodeModules = true, im.Manifest.CarriesNodeModules()
	return v
}

func probeRuntime(configured string) NodeRuntime {
	dir := configured
	switch configured {
	case HostRuntime:
		return NodeRuntime{}
	case "":
		exe, err := os.Executable()
		if err != nil {
			return NodeRuntime{Dir: RuntimeDirName, Missing: RuntimeBinaries[0]}
		}
		dir = filepath.Join(filepath.Dir(exe), RuntimeDirName)
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	r := NodeRuntime{Dir: dir}
	for _, b := range RuntimeBinaries {
		fi, err := os.Stat(filepath.Join(dir, b))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			r.Missing = b
			break
		}
	}
	return r
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
