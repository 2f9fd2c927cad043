// Package substrate is the interface every guest runtime implements (the
// deno and vm packages below it), the values that cross it, and its typed
// errors. A guest outlives the Go value that booted it: each substrate keeps
// one directory per guest under its state dir (spec, pid, log, exit status),
// so a restarted process lists and stops the guests an earlier one started,
// or reports them gone.
package substrate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"time"

	"socialweb.computer/internal/substrate/guestproc"
)

// Substrate runs guests of one kind.
type Substrate interface {
	// Kind names the substrate: "deno", "vm".
	Kind() string
	// Boot starts a guest and returns once its process runs (Phase Booting
	// or Running); it does not wait for the guest to be ready. ctx bounds
	// only the start: the guest runs on until it exits or Stop.
	Boot(ctx context.Context, spec GuestSpec) (GuestStatus, error)
	// Status reports a guest, read from the state dir and the process table.
	Status(ctx context.Context, id string) (GuestStatus, error)
	// Logs returns the last tail lines of the guest's log (all when tail <= 0).
	Logs(ctx context.Context, id string, tail int) ([]byte, error)
	// Stop ends the guest: its whole process group, waiting until no process
	// of it is left. Stopping a guest that already ended is not an error.
	Stop(ctx context.Context, id string) error
	// Remove deletes the state of a guest that is no longer running.
	Remove(ctx context.Context, id string) error
	// List reports every guest in the state dir.
	List(ctx context.Context) ([]GuestStatus, error)
	// Isolation states what stands between this substrate's guests and the host, as the
	// code applies it today: the bidder publishes it in its offering, and a requester may
	// refuse a bidder whose boundary is weaker than it requires.
	Isolation() Isolation
}

// Architected is a substrate whose guests run on a CPU architecture other than this host's
// (the vm substrate's machines are x86_64 whatever the host).
type Architected interface {
	// Arch is the guests' architecture as kubernetes.io/arch names it.
	Arch() string
}

// ArchOf is the CPU architecture s's guests run on, as kubernetes.io/arch names it: what s
// says when it is Architected, else this host's.
func ArchOf(s Substrate) string {
	if a, ok := s.(Architected); ok {
		return a.Arch()
	}
	return runtime.GOARCH
}

// Boundaries an Isolation states, strongest first. The offering lexicon's knownValues.
const (
	// BoundaryVM: a hardware-virtualized or emulated machine per guest, with its own kernel.
	BoundaryVM = "vm"
	// BoundaryNamespace: Linux namespaces and cgroups on the host's own kernel.
	BoundaryNamespace = "namespace"
	// BoundaryProcess: a process on the host's kernel, held only by its runtime's checks.
	BoundaryProcess = "process"
)

// Layers an Isolation names: short, stable words (the offering lexicon's knownValues).
const (
	LayerMountNamespace   = "mount-namespace"
	LayerPIDNamespace     = "pid-namespace"
	LayerUserNamespace    = "user-namespace"
	LayerNetworkNamespace = "network-namespace"
	LayerSeccomp          = "seccomp"
	LayerCgroupLimits     = "cgroup-limits"
	LayerNoNewPrivs       = "no-new-privs"
	LayerDenoPermissions  = "deno-permissions"
	LayerPodSecurity      = "pod-security"
	// LayerPodUserNamespaces: a node's pods with hostUsers: false run in user namespaces of
	// their own (uid 0 in a pod is an unprivileged uid of the host).
	LayerPodUserNamespaces = "pod-user-namespaces"
	LayerKVM               = "kvm"
	LayerTCG               = "tcg"
)

// Isolation is what a substrate applies to every guest: its boundary and each layer. A
// layer is listed only once a test shows it holding; a requester relies on the list.
type Isolation struct {
	Boundary string   `json:"boundary"`
	Layers   []string `json:"layers,omitempty"`
}

// Port is a TCP port the guest listens on, forwarded to the host.
type Port struct {
	Name  string `json:"name"`
	Guest int    `json:"guest"`
}

// PortBinding is where a guest port is reachable: Host on the status's
// Address (always 127.0.0.1).
type PortBinding struct {
	Name  string `json:"name"`
	Guest int    `json:"guest"`
	Host  int    `json:"host"`
}

// Permissions are what a guest may do beyond its deny-all default. The deno
// substrate maps them to Deno's --allow-* flags; the vm substrate, whose
// isolation is the machine and restrict=on networking, accepts only an
// empty set.
type Permissions struct {
	// Net lists host[:port] the guest may connect to (deno --allow-net).
	// The guest's own ports are always granted for listening.
	Net []string `json:"net,omitempty"`
	// Read and Write list paths (deno --allow-read / --allow-write).
	Read  []string `json:"read,omitempty"`
	Write []string `json:"write,omitempty"`
	// Env lists environment variable names the guest may read.
	Env []string `json:"env,omitempty"`
}

// IsZero reports whether p grants nothing.
func (p Permissions) IsZero() bool {
	return len(p.Net) == 0 && len(p.Read) == 0 && len(p.Write) == 0 && len(p.Env) == 0
}

// GuestSpec is what to run.
type GuestSpec struct {
	// ID names the guest; unique within a substrate's state dir.
	ID string `json:"id"`
	// UserData is the program (deno) or the init script (vm).
	UserData []byte `json:"-"`
	// Secrets are delivered to the guest only, as files (see each
	// substrate). They are never written to the spec file, a log line or a
	// command line.
	Secrets map[string][]byte `json:"-"`
	Ports   []Port            `json:"ports,omitempty"`
	CPUs    int               `json:"cpus,omitempty"`
	MemMiB  int               `json:"memMiB,omitempty"`
	// DiskMiB is the disk the contract asks for (0: the substrate's default).
	DiskMiB     int         `json:"diskMiB,omitempty"`
	Permissions Permissions `json:"permissions"`
}

// String prints the spec without UserData or secret values.
func (s GuestSpec) String() string {
	names := make([]string, 0, len(s.Secrets))
	for k := range s.Secrets {
		names = append(names, k)
	}
	return fmt.Sprintf("guest %q (%d bytes userData, secrets %v, ports %v, cpus %d, mem %d MiB)",
		s.ID, len(s.UserData), names, s.Ports, s.CPUs, s.MemMiB)
}

// Phase of a guest.
type Phase string

const (
	// Booting: the process runs but the guest has not said it started.
	Booting Phase = "Booting"
	// Running: the guest runs its userData.
	Running Phase = "Running"
	// Exited: the guest ended by itself; ExitCode is its status.
	Exited Phase = "Exited"
	// Failed: the substrate could not run the guest, or it vanished without
	// an exit status; Message says why.
	Failed Phase = "Failed"
	// Stopped: ended by Stop.
	Stopped Phase = "Stopped"
)

// Ended reports whether no process of the guest runs in this phase.
func (p Phase) Ended() bool { return p == Exited || p == Failed || p == Stopped }

// GuestStatus is what a substrate knows of a guest.
type GuestStatus struct {
	ID    string `json:"id"`
	Kind  string `json:"kind"`
	Phase Phase  `json:"phase"`
	// ExitCode is meaningful when Phase is Exited.
	ExitCode int `json:"exitCode"`
	// Address is where Ports are reachable: 127.0.0.1.
	Address string        `json:"address,omitempty"`
	Ports   []PortBinding `json:"ports,omitempty"`
	// Accelerator is what runs the guest: "kvm" or "tcg" for vm, "none"
	// for deno.
	Accelerator string    `json:"accelerator,omitempty"`
	StartedAt   time.Time `json:"startedAt"`
	// RunningAt is when the guest said it started (vm: the marker line).
	RunningAt time.Time `json:"runningAt,omitzero"`
	EndedAt   time.Time `json:"endedAt,omitzero"`
	// PID is the guest's process group leader on the host (0 once ended).
	PID     int    `json:"pid,omitempty"`
	Message string `json:"message,omitempty"`
}

// HostPort returns the host port bound to the named guest port.
func (g GuestStatus) HostPort(name string) (int, bool) {
	for _, p := range g.Ports {
		if p.Name == name {
			return p.Host, true
		}
	}
	return 0, false
}

// Errors. Every error a substrate returns wraps one of these (errors.Is)
// inside an *Error naming the guest.
var (
	ErrNotFound    = errors.New("no such guest")
	ErrExists      = errors.New("guest already exists")
	ErrInvalidSpec = errors.New("invalid guest spec")
	ErrRunning     = errors.New("guest is running")
	// ErrUnavailable: the substrate cannot run here (a binary or image is
	// missing); the message names what to install.
	ErrUnavailable = errors.New("substrate unavailable")
	// ErrBoot: the guest process could not be started.
	ErrBoot = errors.New("guest failed to start")
)

// Error is a substrate error about one guest.
type Error struct {
	Kind string // substrate kind
	Op   string // "boot", "status", "stop", ...
	ID   string
	Err  error
}

func (e *Error) Error() string {
	if e.ID == "" {
		return fmt.Sprintf("%s substrate: %s: %v", e.Kind, e.Op, e.Err)
	}
	return fmt.Sprintf("%s substrate: %s %s: %v", e.Kind, e.Op, e.ID, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an *Error wrapping sentinel (one of the Err values) with a
// detail message.
func Errorf(kind, op, id string, sentinel error, format string, args ...any) error {
	if format == "" {
		return &Error{Kind: kind, Op: op, ID: id, Err: sentinel}
	}
	return &Error{Kind: kind, Op: op, ID: id, Err: fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))}
}

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`)

// Validate checks the parts of a spec every substrate shares.
func (s GuestSpec) Validate() error {
	if !idRE.MatchString(s.ID) {
		return fmt.Errorf("id %q: want [a-z0-9][a-z0-9._-]{0,62}", s.ID)
	}
	if s.CPUs < 0 || s.CPUs > 64 {
		return fmt.Errorf("cpus %d out of range 0..64", s.CPUs)
	}
	if s.MemMiB < 0 || s.MemMiB > 1<<20 {
		return fmt.Errorf("memMiB %d out of range", s.MemMiB)
	}
	seen := map[string]bool{}
	for _, p := range s.Ports {
		if !nameRE.MatchString(p.Name) {
			return fmt.Errorf("port name %q: want [A-Za-z0-9][A-Za-z0-9_-]*", p.Name)
		}
		if seen[p.Name] {
			return fmt.Errorf("port name %q twice", p.Name)
		}
		seen[p.Name] = true
		if p.Guest < 1 || p.Guest > 65535 {
			return fmt.Errorf("port %s: guest port %d out of range", p.Name, p.Guest)
		}
	}
	for k := range s.Secrets {
		if !nameRE.MatchString(k) {
			return fmt.Errorf("secret name %q: want [A-Za-z0-9][A-Za-z0-9_-]*", k)
		}
	}
	return nil
}

// ValidSecretName reports whether name can name a secret (a file in the guest).
func ValidSecretName(name string) bool { return nameRE.MatchString(name) }

// ValidID reports whether id can name a guest.
func ValidID(id string) bool { return idRE.MatchString(id) }

// WaitRunning polls Status until the guest leaves Booting, returning the
// first status that is not Booting (Running, or ended), or ctx's error.
func WaitRunning(ctx context.Context, s Substrate, id string) (GuestStatus, error) {
	return WaitFor(ctx, s, id, func(g GuestStatus) bool { return g.Phase != Booting })
}

// WaitEnded polls Status until the guest has ended: soon after it is called (a guest that
// fails at once is seen at once), then less and less often, at least once a second
// (endPoll). A bidder waits so on every guest it runs for as long as it runs; at a fixed
// 10 ms, a hundred guests kept most of a core reading their state.
func WaitEnded(ctx context.Context, s Substrate, id string) (GuestStatus, error) {
	return waitFor(ctx, s, id, func(g GuestStatus) bool { return g.Phase.Ended() }, endPoll)
}

// endPoll is how long WaitEnded waits after its nth look (n from 0): 10 ms, doubling, at
// most 1 s.
func endPoll(n int) time.Duration {
	if n >= 7 { // 10 ms << 7 = 1.28 s
		return time.Second
	}
	return 10 * time.Millisecond << n
}

// WaitFor polls Status every 10 ms until cond holds.
func WaitFor(ctx context.Context, s Substrate, id string, cond func(GuestStatus) bool) (GuestStatus, error) {
	return waitFor(ctx, s, id, cond, func(int) time.Duration { return 10 * time.Millisecond })
}

// waitFor polls Status until cond holds, waiting every(n) after the nth look.
func waitFor(ctx context.Context, s Substrate, id string, cond func(GuestStatus) bool, every func(n int) time.Duration) (GuestStatus, error) {
	t := time.NewTimer(0)
	defer t.Stop()
	for n := 0; ; n++ {
		g, err := s.Status(ctx, id)
		if err != nil {
			return g, err
		}
		if cond(g) {
			return g, nil
		}
		t.Reset(every(n))
		select {
		case <-ctx.Done():
			return g, ctx.Err()
		case <-t.C:
		}
	}
}

// StatusFunc reads the status of one guest of a substrate.
type StatusFunc func(ctx context.Context, id string) (GuestStatus, error)

// ListStatuses is List for a substrate whose guests are the directories ids: the status of
// every valid guest ID that status can read, in the order of ids.
func ListStatuses(ctx context.Context, ids []string, status StatusFunc) []GuestStatus {
	out := make([]GuestStatus, 0, len(ids))
	for _, id := range ids {
		if !ValidID(id) {
			continue
		}
		if st, err := status(ctx, id); err == nil {
			out = append(out, st)
		}
	}
	return out
}

// RemoveEnded is Remove for a substrate that keeps a guest's state in dir: it deletes dir
// once status says the guest has ended, and refuses a guest that still runs.
func RemoveEnded(ctx context.Context, kind, id, dir string, status StatusFunc) error {
	st, err := status(ctx, id)
	if err != nil {
		return err
	}
	if !st.Phase.Ended() {
		return Errorf(kind, "remove", id, ErrRunning, "stop it first")
	}
	return os.RemoveAll(dir)
}

// StateDirStatus is Status for a substrate that keeps each guest in a state dir of store:
// ErrNotFound for an unknown ID, Failed when the guest's state file (a JSON T) does not read,
// else what status makes of the state and the supervisor's pid record.
func StateDirStatus[T any](store guestproc.Store, kind, id, stateFile string, status func(dir string, state T, rec guestproc.Record) GuestStatus) (GuestStatus, error) {
	if !ValidID(id) || !store.Exists(id) {
		return GuestStatus{}, Errorf(kind, "status", id, ErrNotFound, "")
	}
	dir := store.Dir(id)
	var state T
	if err := guestproc.ReadJSON(filepath.Join(dir, stateFile), &state); err != nil {
		return GuestStatus{ID: id, Kind: kind, Phase: Failed, Message: "unreadable state: " + err.Error()}, nil
	}
	var rec guestproc.Record
	_ = guestproc.ReadJSON(filepath.Join(dir, guestproc.PidFile), &rec)
	return status(dir, state, rec), nil
}

// StateDirLogs is Logs for a substrate that keeps each guest in a state dir of store: the
// last tail lines of the guest's file logFile (nil before it exists), ErrNotFound for an
// unknown ID.
func StateDirLogs(store guestproc.Store, kind, id, logFile string, tail int) ([]byte, error) {
	if !ValidID(id) || !store.Exists(id) {
		return nil, Errorf(kind, "logs", id, ErrNotFound, "")
	}
	b, err := guestproc.Tail(filepath.Join(store.Dir(id), logFile), tail)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return b, err
}
