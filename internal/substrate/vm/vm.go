// Package vm is the vm substrate: a guest is a qemu microVM booting the
// image from package image (Debian's cloud kernel and our initramfs), whose
// init runs the spec's userData as a shell script and powers the machine
// off when it ends. The accelerator is probed (KVM when a test boot under it
// succeeds, else TCG) and reported; the serial console is the guest log;
// networking is qemu user mode with restrict=on and one host forward per
// spec port, bound to 127.0.0.1.
package vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/vm/image"
)

// Kind is this substrate's name.
const Kind = "vm"

// Marker lines the guest init prints on the serial console.
const (
	MarkerStarted = "socialweb-guest: started"
	markerExited  = "socialweb-guest: exited "
	markerProbe   = "socialweb-guest: probe ok"
)

// Accelerators.
const (
	KVM = "kvm"
	TCG = "tcg"
)

// Files in a guest dir, beside guestproc's pid.json, exit, stopped and log
// (qemu's own stdout and stderr).
const (
	guestFile   = "guest.json"
	serialFile  = "serial.log"
	initrdFile  = "initrd"
	runningFile = "running"
)

// Environment of the userData script inside the guest.
const (
	EnvGuestID    = "SOCIALWEB_GUEST_ID"
	EnvSecretsDir = "SOCIALWEB_SECRETS_DIR"
	EnvPortPrefix = "SOCIALWEB_PORT_" // + NAME: the guest port to listen on
	// GuestSecretsDir holds one file per secret, mode 0400, inside the guest.
	GuestSecretsDir = "/run/secrets"
)

// Config configures the substrate.
type Config struct {
	StateDir string
	// ImageDir holds vmlinuz, initrd.gz and image.json (image.BuildImage).
	ImageDir string
	// QEMU is the qemu-system-x86_64 binary; empty means the one on PATH.
	QEMU string
	// Accelerator forces "kvm" or "tcg"; empty means probe.
	Accelerator string
	// ProbeTimeout bounds the KVM test boot (default 10s).
	ProbeTimeout time.Duration
	// CacheDir keeps the accelerator probe's result for the host (default
	// socialweb under the user cache dir, ~/.cache/socialweb).
	CacheDir string
	// StopGrace is how long Stop waits after SIGTERM (default 3s).
	StopGrace time.Duration
	// ExtraAppend is added to the kernel command line.
	ExtraAppend string
}

// Substrate runs vm guests.
type Substrate struct {
	cfg   Config
	store guestproc.Store
	img   image.Image
	mu    sync.Mutex
}

var _ substrate.Substrate = (*Substrate)(nil)

// New returns the substrate, or ErrUnavailable when qemu or the image is
// missing.
func New(cfg Config) (*Substrate, error) {
	if cfg.StateDir == "" {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrInvalidSpec, "no state dir")
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	cfg.StateDir = abs
	if strings.ContainsAny(cfg.StateDir+cfg.ImageDir, ",\n") {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrInvalidSpec, "state and image dirs must not contain ',' (qemu option syntax)")
	}
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	q, err := exec.LookPath(cfg.QEMU)
	if err != nil {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrUnavailable, "%s not found: run hack/install-guest-deps.sh", cfg.QEMU)
	}
	if cfg.QEMU, err = filepath.Abs(q); err != nil {
		return nil, err
	}
	img, err := image.Load(cfg.ImageDir)
	if err != nil {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrUnavailable, "%v", err)
	}
	switch cfg.Accelerator {
	case "", KVM, TCG:
	default:
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrInvalidSpec, "accelerator %q: want kvm, tcg or empty to probe", cfg.Accelerator)
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 10 * time.Second
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 3 * time.Second
	}
	if cfg.CacheDir == "" {
		if d, err := os.UserCacheDir(); err == nil {
			cfg.CacheDir = filepath.Join(d, "socialweb")
		} else {
			cfg.CacheDir = filepath.Join(cfg.StateDir, ".cache")
		}
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	return &Substrate{cfg: cfg, store: guestproc.Store{Root: cfg.StateDir}, img: img}, nil
}

// Kind implements substrate.Substrate.
func (s *Substrate) Kind() string { return Kind }

// kernel is the kernel qemu boots: the PVH ELF when the image has one.
func (s *Substrate) kernel() string {
	if s.img.PVHKernel != "" {
		return s.img.PVHKernel
	}
	return s.img.Kernel
}

// Image is the image the substrate boots.
func (s *Substrate) Image() image.Image { return s.img }

type guestState struct {
	Spec        substrate.GuestSpec     `json:"spec"`
	Ports       []substrate.PortBinding `json:"ports,omitempty"`
	Accelerator string                  `json:"accelerator"`
	Argv        []string                `json:"argv"`
	StartedAt   time.Time               `json:"startedAt"`
}

// Boot implements substrate.Substrate.
func (s *Substrate) Boot(ctx context.Context, spec substrate.GuestSpec) (substrate.GuestStatus, error) {
	fail := func(sentinel error, format string, args ...any) (substrate.GuestStatus, error) {
		return substrate.GuestStatus{}, substrate.Errorf(Kind, "boot", spec.ID, sentinel, format, args...)
	}
	if err := spec.Validate(); err != nil {
		return fail(substrate.ErrInvalidSpec, "%v", err)
	}
	if !spec.Permissions.IsZero() {
		return fail(substrate.ErrInvalidSpec, "permissions are a deno notion; a vm guest's network is restrict=on plus its ports")
	}
	accel, err := s.Accelerator(ctx)
	if err != nil {
		return fail(substrate.ErrBoot, "accelerator probe: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dir, err := s.store.Create(spec.ID)
	if errors.Is(err, os.ErrExist) {
		return fail(substrate.ErrExists, "")
	}
	if err != nil {
		return fail(substrate.ErrBoot, "state dir: %v", err)
	}
	st, err := s.start(dir, spec, accel)
	if err != nil {
		_ = os.RemoveAll(dir)
		return fail(substrate.ErrBoot, "%v", err)
	}
	return st, nil
}

// userDataArchive is the second initramfs archive: the userData script, its
// environment, and the secrets.
func userDataArchive(spec substrate.GuestSpec) []byte {
	ar := image.NewArchive()
	ar.Add(image.Entry{Name: "userdata/init", Kind: image.File, Mode: 0o700, Data: spec.UserData})
	var env strings.Builder
	fmt.Fprintf(&env, "export %s=%s\n", EnvGuestID, spec.ID)
	fmt.Fprintf(&env, "export SOCIALWEB_HOSTNAME=%s\n", spec.ID)
	for _, p := range spec.Ports {
		fmt.Fprintf(&env, "export %s%s=%d\n", EnvPortPrefix, strings.ToUpper(strings.ReplaceAll(p.Name, "-", "_")), p.Guest)
	}
	if len(spec.Secrets) > 0 {
		fmt.Fprintf(&env, "export %s=%s\n", EnvSecretsDir, GuestSecretsDir)
		ar.Add(image.Entry{Name: strings.TrimPrefix(GuestSecretsDir, "/"), Kind: image.Dir, Mode: 0o700})
		for name, v := range spec.Secrets {
			ar.Add(image.Entry{Name: strings.TrimPrefix(GuestSecretsDir, "/") + "/" + name, Kind: image.File, Mode: 0o400, Data: v})
		}
	}
	ar.Add(image.Entry{Name: "userdata/env", Kind: image.File, Mode: 0o600, Data: []byte(env.String())})
	var b bytes.Buffer
	_ = ar.WriteGzip(&b)
	return b.Bytes()
}

func (s *Substrate) kernelAppend(accel string, extra ...string) string {
	// cryptomgr.notests skips the crypto self-tests at boot: ~0.5 s of a
	// TCG boot (initcall_debug), and a disposable guest runs no FIPS mode.
	args := []string{"console=ttyS0", "quiet", "reboot=t", "panic=-1", "cryptomgr.notests"}
	if accel == TCG {
		// Under TCG with a loaded host the guest's PIT calibration of the
		// TSC fails and the boot stalls; TCG's TSC runs at the host's rate,
		// so tell the guest that rate, and skip the IO-APIC timer check.
		if khz := hostTSCkHz(); khz > 0 {
			args = append(args, "tsc_early_khz="+strconv.Itoa(khz))
		}
		args = append(args, "no_timer_check")
	}
	args = append(args, extra...)
	if s.cfg.ExtraAppend != "" {
		args = append(args, s.cfg.ExtraAppend)
	}
	return strings.Join(args, " ")
}

func (s *Substrate) qemuArgv(accel, serial, initrd, appendLine string, cpus, memMiB int, fwds []string) []string {
	net := "user,id=n0,ipv6=off,restrict=on"
	for _, f := range fwds {
		net += ",hostfwd=" + f
	}
	return s.machineArgv(accel, serial, initrd, appendLine, cpus, memMiB,
		[]string{"-netdev", net, "-device", "virtio-net-device,netdev=n0"})
}

func (s *Substrate) machineArgv(accel, serial, initrd, appendLine string, cpus, memMiB int, devices []string) []string {
	accelArg := accel
	if accel == TCG {
		// One host thread runs every vCPU in turn: multi-threaded TCG has left a
		// loaded host's two-vCPU guest with both CPUs in soft lockup for minutes.
		accelArg = "tcg,thread=single"
	}
	argv := []string{s.cfg.QEMU,
		"-M", "microvm", "-accel", accelArg, "-cpu", "max",
		"-m", strconv.Itoa(memMiB) + "M", "-smp", strconv.Itoa(cpus),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		// qemu runs untrusted guest code: a seccomp filter (no spawning,
		// no obsolete or resource-control calls) and, under root, the uid
		// of nobody once the machine is set up (sandboxArgs).
		"-serial", "file:" + serial,
		"-kernel", s.kernel(), "-initrd", initrd,
		"-append", appendLine,
	}
	argv = append(argv, devices...)
	return append(argv, sandboxArgs()...)
}

// Machine is a microVM boot of the substrate's image for a caller that brings its own
// network and disks (the node substrate's vm flavour): the image's kernel, Initrd (the
// image's initramfs with the caller's archive appended), the serial console to Serial.
type Machine struct {
	Serial, Initrd string
	CPUs, MemMiB   int
	// Devices are qemu arguments: -netdev/-device pairs, -drive, -blockdev.
	Devices []string
	// Append is added to the kernel command line.
	Append []string
}

// MachineArgv is the qemu command line of m under the host's accelerator (probed once, as
// for the substrate's own guests), and that accelerator.
func (s *Substrate) MachineArgv(ctx context.Context, m Machine) ([]string, string, error) {
	accel, err := s.Accelerator(ctx)
	if err != nil {
		return nil, "", err
	}
	return s.machineArgv(accel, m.Serial, m.Initrd, s.kernelAppend(accel, m.Append...), m.CPUs, m.MemMiB, m.Devices), accel, nil
}

// sandboxArgs confines qemu. elevateprivileges stays allowed: -runas needs
// setuid after the filter is in place, and nobody cannot regain root.
func sandboxArgs() []string {
	args := []string{"-sandbox", "on,obsolete=deny,spawn=deny,resourcecontrol=deny"}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("nobody"); err == nil {
			args = append(args, "-runas", "nobody")
		}
	}
	return args
}

func (s *Substrate) start(dir string, spec substrate.GuestSpec, accel string) (substrate.GuestStatus, error) {
	base, err := os.ReadFile(s.img.Initrd)
	if err != nil {
		return substrate.GuestStatus{}, err
	}
	// The kernel unpacks concatenated (compressed) cpio archives in order:
	// the image's initramfs, then this guest's.
	initrd := filepath.Join(dir, initrdFile)
	if err := os.WriteFile(initrd, append(base, userDataArchive(spec)...), 0o600); err != nil {
		return substrate.GuestStatus{}, err
	}
	var ports []substrate.PortBinding
	var fwds []string
	for _, p := range spec.Ports {
		hp, err := guestproc.FreePort()
		if err != nil {
			return substrate.GuestStatus{}, fmt.Errorf("port %s: %v", p.Name, err)
		}
		ports = append(ports, substrate.PortBinding{Name: p.Name, Guest: p.Guest, Host: hp})
		fwds = append(fwds, fmt.Sprintf("tcp:127.0.0.1:%d-:%d", hp, p.Guest))
	}
	cpus, mem := spec.CPUs, spec.MemMiB
	if cpus == 0 {
		cpus = 1
	}
	if mem == 0 {
		mem = 256
	}
	argv := s.qemuArgv(accel, filepath.Join(dir, serialFile), initrd, s.kernelAppend(accel), cpus, mem, fwds)
	gs := guestState{Spec: spec, Ports: ports, Accelerator: accel, Argv: argv, StartedAt: time.Now().UTC()}
	gs.Spec.UserData, gs.Spec.Secrets = nil, nil
	if err := guestproc.WriteJSON(filepath.Join(dir, guestFile), gs); err != nil {
		return substrate.GuestStatus{}, err
	}
	rec, err := guestproc.Start(guestproc.StartOptions{Dir: dir, Argv: argv, Env: []string{}, Cwd: dir, Cleanup: []string{initrdFile}})
	if err != nil {
		return substrate.GuestStatus{}, err
	}
	return s.status(spec.ID, dir, gs, rec), nil
}

// Status implements substrate.Substrate.
func (s *Substrate) Status(ctx context.Context, id string) (substrate.GuestStatus, error) {
	return substrate.StateDirStatus(s.store, Kind, id, guestFile, func(dir string, gs guestState, rec guestproc.Record) substrate.GuestStatus {
		return s.status(id, dir, gs, rec)
	})
}

func (s *Substrate) status(id, dir string, gs guestState, rec guestproc.Record) substrate.GuestStatus {
	st := substrate.GuestStatus{
		ID: id, Kind: Kind, Address: "127.0.0.1", Ports: gs.Ports,
		Accelerator: gs.Accelerator, StartedAt: gs.StartedAt,
	}
	st.RunningAt = runningAt(dir)
	if t, ok := guestproc.Stopped(dir); ok {
		st.Phase, st.EndedAt = substrate.Stopped, t
		return st
	}
	// Liveness first, then the exit file: the supervisor writes the file before it exits,
	// so a supervisor seen gone has left its exit status (read the other way round, an
	// exit in between reads as a guest gone without one).
	alive := rec.Alive()
	if qcode, at, ok := guestproc.Exit(dir); ok && !alive {
		// Ended once the supervisor, which records the status, is gone too.
		st.EndedAt = at
		tail, _ := guestproc.Tail(filepath.Join(dir, serialFile), 40)
		if code, ok := exitMarker(tail); ok {
			st.Phase, st.ExitCode = substrate.Exited, code
			if code != 0 {
				st.Message = fmt.Sprintf("userData exited with status %d", code)
			}
			return st
		}
		st.Phase = substrate.Failed
		if qcode != 0 {
			errTail, _ := guestproc.Tail(filepath.Join(dir, guestproc.LogFile), 3)
			st.Message = fmt.Sprintf("qemu exited with status %d: %s", qcode, strings.TrimSpace(string(errTail)))
		} else {
			st.Message = "the guest powered off before its userData ended: " + lastLine(tail)
		}
		return st
	}
	if !alive {
		st.Phase = substrate.Failed
		st.Message = "qemu is gone without an exit status (killed, or the host restarted)"
		return st
	}
	st.PID = rec.PID
	if st.RunningAt.IsZero() && sawStarted(filepath.Join(dir, serialFile)) {
		now := time.Now().UTC()
		_ = os.WriteFile(filepath.Join(dir, runningFile), []byte(now.Format(time.RFC3339Nano)+"\n"), 0o600)
		st.RunningAt = now
	}
	if st.RunningAt.IsZero() {
		st.Phase = substrate.Booting
	} else {
		st.Phase = substrate.Running
	}
	return st
}

func runningAt(dir string) time.Time {
	b, err := os.ReadFile(filepath.Join(dir, runningFile))
	if err != nil {
		return time.Time{}
	}
	t, _ := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
	return t
}

// sawStarted looks for the started marker in the first MiB of the serial
// log (it comes right after the kernel's boot messages).
func sawStarted(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.TrimRight(sc.Text(), "\r") == MarkerStarted {
			return true
		}
	}
	return false
}

func exitMarker(tail []byte) (int, bool) {
	lines := strings.Split(string(tail), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimRight(lines[i], "\r")
		if strings.HasPrefix(l, markerExited) {
			code, err := strconv.Atoi(strings.TrimPrefix(l, markerExited))
			return code, err == nil
		}
	}
	return 0, false
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// Logs implements substrate.Substrate: the serial console, with LF line
// ends.
func (s *Substrate) Logs(ctx context.Context, id string, tail int) ([]byte, error) {
	b, err := substrate.StateDirLogs(s.store, Kind, id, serialFile, tail)
	// The serial console ends lines with CRLF.
	return bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n")), err
}

// Stop implements substrate.Substrate.
func (s *Substrate) Stop(ctx context.Context, id string) error {
	if !substrate.ValidID(id) || !s.store.Exists(id) {
		return substrate.Errorf(Kind, "stop", id, substrate.ErrNotFound, "")
	}
	dir := s.store.Dir(id)
	if err := guestproc.Stop(ctx, dir, s.cfg.StopGrace); err != nil {
		return &substrate.Error{Kind: Kind, Op: "stop", ID: id, Err: err}
	}
	_ = os.Remove(filepath.Join(dir, initrdFile))
	return nil
}

// Remove implements substrate.Substrate.
func (s *Substrate) Remove(ctx context.Context, id string) error {
	return substrate.RemoveEnded(ctx, Kind, id, s.store.Dir(id), s.Status)
}

// List implements substrate.Substrate.
func (s *Substrate) List(ctx context.Context) ([]substrate.GuestStatus, error) {
	ids, err := s.store.IDs()
	if err != nil {
		return nil, err
	}
	return substrate.ListStatuses(ctx, ids, s.Status), nil
}

// hostTSCkHz reads the host CPU's clock from /proc/cpuinfo ("cpu MHz"),
// which is the rate of the TSC a TCG guest reads.
func hostTSCkHz() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0
			}
			return int(f * 1000)
		}
	}
	return 0
}
