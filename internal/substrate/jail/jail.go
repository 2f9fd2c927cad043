// Package jail runs one guest program contained: in mount, PID, IPC and UTS namespaces of its
// own, on a root that holds only what the program needs (bind mounts, read-only unless said
// otherwise), inside its cgroups, as an unprivileged uid of its own with no capabilities and
// no_new_privs.
//
// The init is this package's Run, reached through a re-exec of the calling binary
// (`socialweb guest-jail CONFIG`, answered by MaybeRun first thing in main, or a test
// binary's TestMain)
// under util-linux unshare(1), which makes the namespaces and forks it as PID 1 of the new
// PID namespace. Run, still root on the host:
//
//  1. joins the guest's cgroups (so the program is inside them before it runs: no race),
//  2. mounts a small tmpfs as the new root, binds the listed paths into it, mounts a /proc
//     of the new PID namespace, pivot_roots into it, detaches the host's tree and makes the
//     root read-only,
//  3. sets no_new_privs, empties the capability bounding set, installs a seccomp filter that
//     refuses namespaces, mounts, ptrace and kernel interfaces a JavaScript runtime does not
//     use (seccomp.go), and
//  4. forks the program as Config.UID/GID with no supplementary groups (the change of uid
//     clears every capability), forwards SIGTERM/SIGINT/SIGHUP to it, reaps every orphan,
//     and exits with the program's status (128+signal when killed) as soon as it ends; the
//     kernel then kills whatever else is left in the PID namespace.
package jail

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"socialweb.computer/internal/selfexe"
)

// Command is the argument that makes a binary run the init: `<binary> guest-jail CONFIG`.
const Command = "guest-jail"

// Mount is a bind mount into the jail's root.
type Mount struct {
	// Source is the host path (a file or a directory; symlinks are followed).
	Source string `json:"source"`
	// Target is the absolute path inside the jail.
	Target string `json:"target"`
	// Writable mounts read-write; default read-only.
	Writable bool `json:"writable,omitempty"`
	// Exec allows executing files from it; default noexec.
	Exec bool `json:"exec,omitempty"`
	// Dev allows device nodes (for /dev/null and its kind); default nodev.
	Dev bool `json:"dev,omitempty"`
}

// Config is what the init reads from its CONFIG file (written by the substrate, 0600, outside
// what the jail sees).
type Config struct {
	// Root is an empty host directory the jail's tmpfs root is mounted on (in the jail's own
	// mount namespace: the host never sees the mount).
	Root   string  `json:"root"`
	Mounts []Mount `json:"mounts"`
	// Cgroups are the cgroup directories the init joins before anything else.
	Cgroups []string `json:"cgroups,omitempty"`
	UID     int      `json:"uid"`
	GID     int      `json:"gid"`
	// Argv is the program; Argv[0] an absolute path inside the jail. Its environment is the
	// init's own (the caller's, already scrubbed).
	Argv     []string `json:"argv"`
	Cwd      string   `json:"cwd"`
	Hostname string   `json:"hostname,omitempty"`
}

// Validate checks what the init relies on.
func (c Config) Validate() error {
	switch {
	case !filepath.IsAbs(c.Root):
		return fmt.Errorf("root %q: want an absolute path", c.Root)
	case c.UID <= 0 || c.GID <= 0:
		return fmt.Errorf("uid %d gid %d: the program must not run as root", c.UID, c.GID)
	case len(c.Argv) == 0 || !filepath.IsAbs(c.Argv[0]):
		return fmt.Errorf("argv %q: want an absolute program path", c.Argv)
	case !filepath.IsAbs(c.Cwd):
		return fmt.Errorf("cwd %q: want an absolute path", c.Cwd)
	}
	for _, m := range c.Mounts {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) || filepath.Clean(m.Target) == "/" {
			return fmt.Errorf("mount %q -> %q: want absolute paths, not the root", m.Source, m.Target)
		}
	}
	return nil
}

// Argv is the command line that runs the program of the config at configPath jailed: unshare
// (absolute path) making the namespaces, then self (the binary that answers Command).
func Argv(unshare, self, configPath string) []string {
	return []string{unshare, "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--propagation", "private",
		"--", self, Command, configPath}
}

// MaybeRun runs the init and exits when this process was started as one (os.Args[1] ==
// Command); otherwise it returns. socialweb's main and test binaries' TestMain call it first
// thing.
func MaybeRun() {
	answers.Store(true)
	if len(os.Args) == 3 && os.Args[1] == Command {
		os.Exit(Run(os.Args[2]))
	}
}

var answers atomic.Bool

// Answers reports whether this binary answers Command (it called MaybeRun), so it can be the
// jail's init. A binary that does not would take `guest-jail CONFIG` for something else (a
// test binary runs its tests).
func Answers() bool { return answers.Load() }

// Exit statuses of the init itself (the program's own status passes through otherwise).
const (
	ExitSetup = 125 // the jail could not be set up; the reason is on stderr (the guest's log)
)

// Run is the init: it sets up the jail of the config at path, runs the program and returns
// the status to exit with. Errors go to stderr, which is the guest's log.
func Run(path string) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "guest jail: "+format+"\n", args...)
		return ExitSetup
	}
	if os.Getpid() != 1 {
		return fail("not PID 1 of a PID namespace of its own (run it through unshare --pid --fork)")
	}
	// no_new_privs, the bounding set and the seccomp filter are per thread, and the program
	// inherits them from the thread that forks it: set them and fork on this one thread.
	runtime.LockOSThread()
	b, err := os.ReadFile(path)
	if err != nil {
		return fail("%v", err)
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return fail("config %s: %v", path, err)
	}
	if err := c.Validate(); err != nil {
		return fail("config %s: %v", path, err)
	}
	// Signals that arrive while the jail is built are held and passed on to the program.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	for _, d := range c.Cgroups {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte("0"), 0); err != nil {
			return fail("join cgroup %s: %v", d, err)
		}
	}
	if err := setupRoot(c); err != nil {
		return fail("%v", err)
	}
	if c.Hostname != "" {
		if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
			return fail("sethostname: %v", err)
		}
	}
	if err := dropPrivileges(); err != nil {
		return fail("%v", err)
	}
	if err := installSeccomp(); err != nil {
		return fail("%v", err)
	}
	pid, err := syscall.ForkExec(c.Argv[0], c.Argv, &syscall.ProcAttr{
		Dir:   c.Cwd,
		Env:   os.Environ(),
		Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: uint32(c.UID), Gid: uint32(c.GID), Groups: []uint32{}},
			Pdeathsig:  syscall.SIGKILL,
		},
	})
	if err != nil {
		return fail("start %s: %v", c.Argv[0], err)
	}
	go func() {
		for s := range sigs {
			_ = syscall.Kill(pid, s.(syscall.Signal))
		}
	}()
	// The init lives as long as the guest: hand back the heap its binary's package
	// initialisers left. (Not the executable's pages, as procmem.Settle would: they are
	// shared with every other init and the bidder, and paging them out makes the next
	// guest's init read them back.)
	debug.FreeOSMemory()
	// PID 1 reaps every orphan of the namespace; it leaves when the program itself ends.
	for {
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return fail("wait: %v", err)
		}
		if wpid != pid {
			continue
		}
		switch {
		case ws.Exited():
			return ws.ExitStatus()
		case ws.Signaled():
			return 128 + int(ws.Signal())
		}
	}
}

// setupRoot builds the jail's root on c.Root and moves this process into it.
func setupRoot(c Config) error {
	// Nothing mounted from here on propagates back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %v", err)
	}
	if err := unix.Mount("tmpfs", c.Root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m,nr_inodes=4096"); err != nil {
		return fmt.Errorf("tmpfs root on %s: %v", c.Root, err)
	}
	for _, m := range c.Mounts {
		if err := bind(c.Root, m); err != nil {
			return err
		}
	}
	proc := filepath.Join(c.Root, "proc")
	if err := os.MkdirAll(proc, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount proc: %v", err)
	}
	// pivot_root(".", "."), then detaching ".": the old root goes without a directory for it
	// in the new one (the runc way).
	if err := unix.Chdir(c.Root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %v", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %v", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("root read-only: %v", err)
	}
	return nil
}

// bind mounts m below root: the target (a directory, or an empty file for a file) is made in
// the tmpfs, then bound and remounted with m's flags (a bind mount takes its flags only on a
// remount).
func bind(root string, m Mount) error {
	fi, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("bind %s: %v", m.Source, err)
	}
	target := filepath.Join(root, m.Target)
	if fi.IsDir() {
		err = os.MkdirAll(target, 0o755)
	} else {
		if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
			var f *os.File
			if f, err = os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o444); err == nil {
				err = f.Close()
			}
		}
	}
	if err != nil {
		return fmt.Errorf("bind target %s: %v", m.Target, err)
	}
	if err := unix.Mount(m.Source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %v", m.Source, m.Target, err)
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID)
	if !m.Writable {
		flags |= unix.MS_RDONLY
	}
	if !m.Exec {
		flags |= unix.MS_NOEXEC
	}
	if !m.Dev {
		flags |= unix.MS_NODEV
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("remount %s: %v", m.Target, err)
	}
	return nil
}

// dropPrivileges sets no_new_privs (inherited: no exec regains a privilege) and empties the
// bounding set, so the program, which changes to an unprivileged uid when it starts, holds no
// capability in any set (the uid change clears permitted, effective and ambient).
func dropPrivileges() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %v", err)
	}
	last := unix.CAP_LAST_CAP
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("drop capability %d from the bounding set: %v", c, err)
		}
	}
	return nil
}

// Unshare finds util-linux unshare(1).
func Unshare() (string, error) {
	return exec.LookPath("unshare")
}

// InitBinary is the name of the init's own small binary (cmd/socialweb-guest-jail), looked
// for beside the binary that starts guests.
const InitBinary = "socialweb-guest-jail"

// InitBeside returns the InitBinary in self's directory when one is there to be trusted with
// root (selfexe.Beside); "" otherwise: the caller is its own init.
func InitBeside(self string) string { return selfexe.Beside(self, InitBinary) }
