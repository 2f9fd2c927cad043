// Package deno is the deno substrate: a guest is `deno run` of the spec's
// userData with Deno's permissions denied except what the spec grants,
// never prompting, in its own session and process group, with its own
// working dir and a scrubbed environment, and contained by package jail: its
// own mount, PID, IPC and UTS namespaces with only its files, the deno binary
// and its libraries in view, its own cgroups with the contract's limits, and
// a uid of its own with no capabilities. Deno's permissions are the inner
// layer, the jail the outer one.
package deno

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"socialweb.computer/internal/crashpoint"
	"socialweb.computer/internal/denodist"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/jail"
)

// Kind is this substrate's name.
const Kind = "deno"

// Files in a guest dir, beside guestproc's pid.json, exit, stopped and log.
const (
	guestFile   = "guest.json"
	programFile = "main.ts"
	secretsDir  = "secrets"
	workDir     = "work"
	cacheDir    = "deno-dir"
	jailFile    = "jail.json"  // the jail's config, read by its init (outside the jail's view)
	rootDir     = "root"       // the jail's root is mounted here, in the jail's namespace only
	oomFile     = "oom-killed" // the cgroups, gone after Stop, had an OOM kill
)

// Environment variables the guest program can read (each granted by
// --allow-env for exactly that name).
const (
	EnvGuestID    = "SOCIALWEB_GUEST_ID"
	EnvSecretsDir = "SOCIALWEB_SECRETS_DIR"
	// EnvPortPrefix + NAME (upper case, '-' as '_') holds the port the
	// guest must listen on, on 127.0.0.1, for guest port NAME.
	EnvPortPrefix = "SOCIALWEB_PORT_"
)

// EnvDeno overrides the default Deno binary.
const EnvDeno = "SOCIALWEB_DENO"

// Config configures the substrate.
type Config struct {
	// StateDir holds one directory per guest.
	StateDir string
	// Deno is the deno binary; empty means DefaultBinary().
	Deno string
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL
	// (default 2s).
	StopGrace time.Duration
	// Init is the binary that runs the jail's init when given jail.Command (socialweb, its
	// small socialweb-guest-jail, or a test binary whose TestMain calls jail.MaybeRun); empty
	// means the small one beside this process's binary, else this binary.
	Init string
	// UIDs is where guests' uids come from; zero means jail.DefaultUIDs.
	UIDs jail.UIDs
	// Pids caps the tasks (processes and threads) of a guest (default 256).
	Pids int
	// CgroupRoot is where the cgroup file system is mounted (default /sys/fs/cgroup).
	CgroupRoot string
	// Unjailed runs deno with its permission flags alone, as this process's uid, with no
	// namespaces or cgroups: the baseline that containment's cost is measured against (the
	// containment benchmark). No command of socialweb sets it; a guest so run can import
	// every JSON file its bidder can read.
	Unjailed bool
}

// Substrate runs deno guests.
type Substrate struct {
	cfg     Config
	store   guestproc.Store
	mu      sync.Mutex
	unshare string       // util-linux unshare(1)
	cgroups jail.Cgroups // the host's cgroup hierarchy
	libs    []string     // what the deno binary loads
}

var _ substrate.Substrate = (*Substrate)(nil)

// New returns the substrate; it fails with ErrUnavailable when no deno
// binary is found.
func New(cfg Config) (*Substrate, error) {
	if cfg.StateDir == "" {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrInvalidSpec, "no state dir")
	}
	if cfg.Deno == "" {
		cfg.Deno = DefaultBinary()
	}
	if cfg.Deno == "" {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrUnavailable, "no deno binary: run socialweb install-deps (or up, which fetches the pinned one), or set %s", EnvDeno)
	}
	abs, err := filepath.Abs(cfg.Deno)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(abs); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrUnavailable, "deno binary %s is not an executable file", abs)
	}
	cfg.Deno = abs
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 2 * time.Second
	}
	if cfg.UIDs == (jail.UIDs{}) {
		cfg.UIDs = jail.DefaultUIDs
	}
	if cfg.Pids <= 0 {
		cfg.Pids = 256
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = "/sys/fs/cgroup"
	}
	unavailable := func(format string, args ...any) (*Substrate, error) {
		return nil, substrate.Errorf(Kind, "new", "", substrate.ErrUnavailable, format, args...)
	}
	// Every guest is jailed: namespaces, cgroups and a uid per guest need root.
	if os.Geteuid() != 0 {
		return unavailable("deno guests run jailed (namespaces, cgroups, a uid of their own), which needs root: run the bidder as root")
	}
	if cfg.Init == "" {
		self, err := os.Executable()
		if err != nil {
			return unavailable("the jail's init is this binary, which cannot be found: %v", err)
		}
		// The small init beside this binary starts each guest about 80 ms sooner than
		// socialweb itself would (hack/build.sh builds both).
		switch small := jail.InitBeside(self); {
		case small != "":
			cfg.Init = small
		case jail.Answers():
			cfg.Init = self
		default:
			return unavailable("this binary is not a jail init (it does not call jail.MaybeRun first in main or TestMain), Config.Init names none and no %s is beside it", jail.InitBinary)
		}
	}
	unshare, err := jail.Unshare()
	if err != nil {
		return unavailable("no unshare (util-linux): %v", err)
	}
	cgroups, err := jail.ProbeCgroups(cfg.CgroupRoot, "socialweb-guests")
	if err != nil {
		return unavailable("no cgroup hierarchy for the guests' limits: %v", err)
	}
	libs, err := jail.Libraries(cfg.Deno)
	if err != nil {
		return unavailable("libraries of %s: %v", cfg.Deno, err)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	return &Substrate{cfg: cfg, store: guestproc.Store{Root: cfg.StateDir}, unshare: unshare, cgroups: cgroups, libs: libs}, nil
}

// DefaultBinary finds deno: $SOCIALWEB_DENO, else the project's own install
// (.cache/deno from hack/install-deno.sh, in the module root above the
// working directory), else the pinned one `up` fetched into the user's cache
// (denodist), else deno on PATH; "" when there is none.
func DefaultBinary() string {
	if p := os.Getenv(EnvDeno); p != "" {
		return p
	}
	if root := moduleRoot(); root != "" {
		for _, rel := range []string{"node_modules/@deno/linux-x64-glibc/deno", "node_modules/@deno/linux-arm64-glibc/deno"} {
			p := filepath.Join(root, ".cache", "deno", rel)
			if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
				return p
			}
		}
	}
	if p := denodist.InstalledBinary(); p != "" {
		return p
	}
	if p, err := exec.LookPath("deno"); err == nil {
		return p
	}
	return ""
}

// moduleRoot walks up from the working directory to the go.mod of module
// socialweb.computer.
func moduleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module socialweb.computer\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// Kind implements substrate.Substrate.
func (s *Substrate) Kind() string { return Kind }

// Binary is the deno binary in use.
func (s *Substrate) Binary() string { return s.cfg.Deno }

// guestState is guest.json: the spec without userData or secrets, and what
// Boot decided.
type guestState struct {
	Spec      substrate.GuestSpec     `json:"spec"`
	Ports     []substrate.PortBinding `json:"ports,omitempty"`
	Argv      []string                `json:"argv"`
	StartedAt time.Time               `json:"startedAt"`
	// UID is the guest's own host uid (and gid).
	UID int `json:"uid"`
	// Cgroups are the guest's cgroup directories, removed on Stop and Remove.
	Cgroups []string `json:"cgroups,omitempty"`
}

func validNet(e string) bool {
	return e != "" && !strings.ContainsAny(e, ", \t\n\"'=/") && len(e) <= 255
}

func validPath(e string) bool {
	return e != "" && !strings.ContainsAny(e, ",\n\x00")
}

// Boot implements substrate.Substrate.
func (s *Substrate) Boot(ctx context.Context, spec substrate.GuestSpec) (substrate.GuestStatus, error) {
	fail := func(sentinel error, format string, args ...any) (substrate.GuestStatus, error) {
		return substrate.GuestStatus{}, substrate.Errorf(Kind, "boot", spec.ID, sentinel, format, args...)
	}
	if err := spec.Validate(); err != nil {
		return fail(substrate.ErrInvalidSpec, "%v", err)
	}
	if len(spec.UserData) == 0 {
		return fail(substrate.ErrInvalidSpec, "empty userData (the program)")
	}
	for _, e := range spec.Permissions.Net {
		if !validNet(e) {
			return fail(substrate.ErrInvalidSpec, "permissions.net entry %q", e)
		}
	}
	for _, e := range append(append([]string{}, spec.Permissions.Read...), spec.Permissions.Write...) {
		if !validPath(e) {
			return fail(substrate.ErrInvalidSpec, "permissions path %q", e)
		}
	}
	for _, e := range spec.Permissions.Env {
		if !validNet(e) {
			return fail(substrate.ErrInvalidSpec, "permissions.env entry %q", e)
		}
	}
	if err := ctx.Err(); err != nil {
		return fail(substrate.ErrBoot, "%v", err)
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
	uid, err := s.cfg.UIDs.Take(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return fail(substrate.ErrBoot, "%v", err)
	}
	crashpoint.Hit(crashpoint.DenoAfterStateDir)
	var cgroups []string
	st, err := s.start(dir, spec, uid, &cgroups)
	if err != nil {
		_ = jail.RemoveCgroups(cgroups)
		_ = os.RemoveAll(dir)
		s.cfg.UIDs.Release(uid, dir)
		return fail(substrate.ErrBoot, "%v", err)
	}
	return st, nil
}

// own makes path the guest's (its uid and gid) with mode.
func own(path string, uid int, mode os.FileMode) error {
	if err := os.Chown(path, uid, uid); err != nil {
		return err
	}
	return os.Chmod(path, mode)
}

func (s *Substrate) start(dir string, spec substrate.GuestSpec, uid int, cgroups *[]string) (substrate.GuestStatus, error) {
	prog := filepath.Join(dir, programFile)
	if err := os.WriteFile(prog, spec.UserData, 0o400); err != nil {
		return substrate.GuestStatus{}, err
	}
	if err := own(prog, uid, 0o400); err != nil {
		return substrate.GuestStatus{}, err
	}
	work := filepath.Join(dir, workDir)
	cache := filepath.Join(dir, cacheDir)
	for _, d := range []string{work, cache} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return substrate.GuestStatus{}, err
		}
		if err := own(d, uid, 0o700); err != nil {
			return substrate.GuestStatus{}, err
		}
	}
	env := []string{
		"HOME=" + work,
		"DENO_DIR=" + cache,
		"DENO_NO_UPDATE_CHECK=1",
		"DENO_NO_PROMPT=1",
		"NO_COLOR=1",
		"TMPDIR=" + work,
		EnvGuestID + "=" + spec.ID,
	}
	allowEnv := []string{EnvGuestID}
	var allowNet, allowRead []string
	var cleanup []string
	if len(spec.Secrets) > 0 {
		sd := filepath.Join(dir, secretsDir)
		if err := os.Mkdir(sd, 0o700); err != nil {
			return substrate.GuestStatus{}, err
		}
		for name, v := range spec.Secrets {
			if err := os.WriteFile(filepath.Join(sd, name), v, 0o400); err != nil {
				return substrate.GuestStatus{}, err
			}
			if err := own(filepath.Join(sd, name), uid, 0o400); err != nil {
				return substrate.GuestStatus{}, err
			}
		}
		if err := own(sd, uid, 0o500); err != nil {
			return substrate.GuestStatus{}, err
		}
		env = append(env, EnvSecretsDir+"="+sd)
		allowEnv = append(allowEnv, EnvSecretsDir)
		allowRead = append(allowRead, sd)
		cleanup = append(cleanup, secretsDir)
	}
	var ports []substrate.PortBinding
	for _, p := range spec.Ports {
		hp, err := guestproc.FreePort()
		if err != nil {
			return substrate.GuestStatus{}, fmt.Errorf("port %s: %v", p.Name, err)
		}
		ports = append(ports, substrate.PortBinding{Name: p.Name, Guest: p.Guest, Host: hp})
		name := EnvPortPrefix + strings.ToUpper(strings.ReplaceAll(p.Name, "-", "_"))
		env = append(env, name+"="+strconv.Itoa(hp))
		allowEnv = append(allowEnv, name)
		allowNet = append(allowNet, "127.0.0.1:"+strconv.Itoa(hp))
	}
	allowNet = append(allowNet, spec.Permissions.Net...)
	allowRead = append(allowRead, spec.Permissions.Read...)
	allowEnv = append(allowEnv, spec.Permissions.Env...)

	argv := []string{s.cfg.Deno, "run",
		"--no-prompt", "--no-config", "--no-lock", "--no-remote", "--no-npm",
		"--allow-env=" + strings.Join(allowEnv, ","),
	}
	if len(allowNet) > 0 {
		argv = append(argv, "--allow-net="+strings.Join(allowNet, ","))
	}
	if len(allowRead) > 0 {
		argv = append(argv, "--allow-read="+strings.Join(allowRead, ","))
	}
	if len(spec.Permissions.Write) > 0 {
		argv = append(argv, "--allow-write="+strings.Join(spec.Permissions.Write, ","))
	}
	if spec.MemMiB > 0 {
		argv = append(argv, "--v8-flags=--max-old-space-size="+strconv.Itoa(spec.MemMiB))
	}
	argv = append(argv, prog)
	sort.Strings(env)

	launch := argv
	if !s.cfg.Unjailed {
		var err error
		if launch, err = s.jail(dir, spec, uid, argv, work, cgroups); err != nil {
			return substrate.GuestStatus{}, err
		}
	}
	startedAt := time.Now().UTC()
	gs := guestState{Spec: spec, Ports: ports, Argv: argv, StartedAt: startedAt, UID: uid, Cgroups: *cgroups}
	gs.Spec.UserData, gs.Spec.Secrets = nil, nil
	if err := guestproc.WriteJSON(filepath.Join(dir, guestFile), gs); err != nil {
		return substrate.GuestStatus{}, err
	}
	rec, err := guestproc.Start(guestproc.StartOptions{Dir: dir, Argv: launch, Env: env, Cwd: work, Cleanup: cleanup})
	if err != nil {
		return substrate.GuestStatus{}, err
	}
	return s.status(spec.ID, dir, gs, rec), nil
}

// jail makes the guest's cgroups (into *cgroups) and its jail's config, and returns the
// command line that runs argv in that jail.
func (s *Substrate) jail(dir string, spec substrate.GuestSpec, uid int, argv []string, work string, cgroups *[]string) ([]string, error) {
	cg, err := s.cgroups.Create(fmt.Sprintf("deno-%d", uid), jail.Limits{CPUs: spec.CPUs, MemMiB: spec.MemMiB, Pids: s.cfg.Pids})
	*cgroups = cg
	if err != nil {
		return nil, fmt.Errorf("cgroups: %v", err)
	}
	root := filepath.Join(dir, rootDir)
	if err := os.Mkdir(root, 0o700); err != nil {
		return nil, err
	}
	jc := jail.Config{Root: root, Mounts: s.mounts(dir, spec), Cgroups: cg, UID: uid, GID: uid,
		Argv: argv, Cwd: work, Hostname: "guest"}
	if err := jc.Validate(); err != nil {
		return nil, err
	}
	jailPath := filepath.Join(dir, jailFile)
	if err := guestproc.WriteJSON(jailPath, jc); err != nil {
		return nil, err
	}
	return jail.Argv(s.unshare, s.cfg.Init, jailPath), nil
}

// devices are the device nodes a guest sees (Deno opens /dev/null for the standard
// streams it does not inherit, and random sources).
var devices = []string{"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"}

// mounts are what the guest's jail shows, each at its host path (so the paths in argv, the
// environment and the guest's messages are the same inside and out): the deno binary and
// its libraries, a few devices, the program (read-only), work/ and deno-dir/ (read-write),
// secrets/ (read-only), and the paths Permissions grants (operators' grants: the bidder gives
// none). Not the guest dir itself: pid.json, exit, guest.json and jail.json stay out of view.
func (s *Substrate) mounts(dir string, spec substrate.GuestSpec) []jail.Mount {
	ms := []jail.Mount{{Source: s.cfg.Deno, Target: s.cfg.Deno, Exec: true}}
	for _, l := range s.libs {
		ms = append(ms, jail.Mount{Source: l, Target: l, Exec: true})
	}
	for _, d := range devices {
		ms = append(ms, jail.Mount{Source: d, Target: d, Dev: true, Writable: d == "/dev/null"})
	}
	ms = append(ms,
		jail.Mount{Source: filepath.Join(dir, programFile), Target: filepath.Join(dir, programFile)},
		jail.Mount{Source: filepath.Join(dir, workDir), Target: filepath.Join(dir, workDir), Writable: true},
		jail.Mount{Source: filepath.Join(dir, cacheDir), Target: filepath.Join(dir, cacheDir), Writable: true},
	)
	if len(spec.Secrets) > 0 {
		ms = append(ms, jail.Mount{Source: filepath.Join(dir, secretsDir), Target: filepath.Join(dir, secretsDir)})
	}
	for _, p := range spec.Permissions.Read {
		if filepath.IsAbs(p) && exists(p) {
			ms = append(ms, jail.Mount{Source: p, Target: p})
		}
	}
	for _, p := range spec.Permissions.Write {
		if filepath.IsAbs(p) && exists(p) {
			ms = append(ms, jail.Mount{Source: p, Target: p, Writable: true})
		}
	}
	return ms
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
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
		Accelerator: "none", StartedAt: gs.StartedAt,
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
		// Ended once the supervisor, which records the status, is gone too.
		st.Phase, st.ExitCode, st.EndedAt = substrate.Exited, code, at
		st.RunningAt = gs.StartedAt
		switch {
		case code == 128+int(syscall.SIGKILL) && (exists(filepath.Join(dir, oomFile)) || jail.OOMKilled(gs.Cgroups)):
			st.Message = fmt.Sprintf("killed by the kernel: the guest passed its memory limit of %d MiB", gs.Spec.MemMiB)
		case code == jail.ExitSetup:
			st.Message = "the guest's jail could not be set up (its log says why)"
		case code != 0:
			st.Message = fmt.Sprintf("program exited with status %d", code)
		}
		return st
	}
	if alive {
		st.Phase, st.PID, st.RunningAt = substrate.Running, rec.PID, gs.StartedAt
		return st
	}
	st.Phase = substrate.Failed
	st.Message = "guest process is gone without an exit status (killed, or the host restarted)"
	return st
}

// Logs implements substrate.Substrate.
func (s *Substrate) Logs(ctx context.Context, id string, tail int) ([]byte, error) {
	return substrate.StateDirLogs(s.store, Kind, id, guestproc.LogFile, tail)
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
	_ = os.RemoveAll(filepath.Join(dir, secretsDir))
	var gs guestState
	if err := guestproc.ReadJSON(filepath.Join(dir, guestFile), &gs); err == nil {
		if err := removeCgroups(dir, gs); err != nil {
			return &substrate.Error{Kind: Kind, Op: "stop", ID: id, Err: err}
		}
	}
	return nil
}

// removeCgroups removes the guest's cgroups, first noting in the guest dir whether the OOM
// killer struck there (Status still says why an ended guest was killed).
func removeCgroups(dir string, gs guestState) error {
	if jail.OOMKilled(gs.Cgroups) {
		_ = os.WriteFile(filepath.Join(dir, oomFile), nil, 0o600)
	}
	return jail.RemoveCgroups(gs.Cgroups)
}

// Remove implements substrate.Substrate.
func (s *Substrate) Remove(ctx context.Context, id string) error {
	dir := s.store.Dir(id)
	var gs guestState
	_ = guestproc.ReadJSON(filepath.Join(dir, guestFile), &gs)
	if err := substrate.RemoveEnded(ctx, Kind, id, dir, s.Status); err != nil {
		return err
	}
	if err := jail.RemoveCgroups(gs.Cgroups); err != nil {
		return &substrate.Error{Kind: Kind, Op: "remove", ID: id, Err: err}
	}
	if gs.UID > 0 {
		s.cfg.UIDs.Release(gs.UID, dir)
	}
	return nil
}

// List implements substrate.Substrate.
func (s *Substrate) List(ctx context.Context) ([]substrate.GuestStatus, error) {
	ids, err := s.store.IDs()
	if err != nil {
		return nil, err
	}
	return substrate.ListStatuses(ctx, ids, s.Status), nil
}
