// Package guestproc is what the host-process substrates share: a state dir
// with one directory per guest, a guest started as its own session and
// process group under a small /bin/sh supervisor that records the exit
// status in the guest dir (so the status survives the Go process that
// started it), liveness checks that survive pid reuse, and stopping a whole
// process group.
//
// A caller that stays to supervise its child itself (the tenant control
// planes: restarted on exit, measured by pid) starts it Direct: the same
// session, log and pid record, without the shell supervisor, and waits on
// Child.Done.
package guestproc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"socialweb.computer/internal/atomicfile"
	"socialweb.computer/internal/crashpoint"
)

// Files in a guest dir.
const (
	PidFile     = "pid.json"
	ExitFile    = "exit"
	StoppedFile = "stopped"
	LogFile     = "log"
)

// Store is a state dir holding one directory per guest.
type Store struct{ Root string }

// Dir is the directory of guest id.
func (s Store) Dir(id string) string { return filepath.Join(s.Root, id) }

// Create makes the guest dir; os.ErrExist when it is there already.
func (s Store) Create(id string) (string, error) {
	if err := os.MkdirAll(s.Root, 0o700); err != nil {
		return "", err
	}
	d := s.Dir(id)
	if err := os.Mkdir(d, 0o700); err != nil {
		return "", err
	}
	return d, nil
}

// Exists reports whether guest id has a dir.
func (s Store) Exists(id string) bool {
	fi, err := os.Stat(s.Dir(id))
	return err == nil && fi.IsDir()
}

// IDs lists the guests, sorted; names starting with "." are not guests.
func (s Store) IDs() ([]string, error) {
	ents, err := os.ReadDir(s.Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// WriteJSON writes v to path atomically with mode 0600.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, append(b, '\n'), 0o600)
}

// ReadJSON reads path into v.
func ReadJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// Record identifies a guest's supervisor process, which leads the guest's
// session and process group (pgid == PID). StartTicks (field 22 of
// /proc/PID/stat) tells it apart from a later process with the same pid.
type Record struct {
	PID        int       `json:"pid"`
	StartTicks uint64    `json:"startTicks"`
	StartedAt  time.Time `json:"startedAt"`
	// Direct: PID is the guest itself, started without a supervisor.
	Direct bool `json:"direct,omitempty"`
}

// StartOptions describe the guest process.
type StartOptions struct {
	Dir  string   // the guest dir: pid.json, exit and the log go here
	Argv []string // the guest command; Argv[0] an absolute path
	Env  []string // the whole environment (nothing is inherited)
	Cwd  string
	// Cleanup names entries of Dir ([A-Za-z0-9._-]+) that the supervisor
	// deletes when the guest exits by itself (secrets, per-guest initrd).
	Cleanup []string
	// Log and PidFile are where the output is appended and the Record
	// written; empty, Dir/log and Dir/pid.json.
	Log, PidFile string
	// Direct runs Argv as the session leader itself, without the
	// supervisor: the recorded pid is the guest's, and nothing records its
	// exit (no exit file, no Cleanup), so the caller waits on Child.Done.
	Direct bool
	// ParentDeathSignal, when set, is sent to the leader when the thread
	// that started it ends (PR_SET_PDEATHSIG): a guest that must not
	// outlive the process that supervises it.
	ParentDeathSignal syscall.Signal
}

func (o StartOptions) logPath() string     { return orJoin(o.Log, o.Dir, LogFile) }
func (o StartOptions) pidFilePath() string { return orJoin(o.PidFile, o.Dir, PidFile) }

func orJoin(path, dir, name string) string {
	if path != "" {
		return path
	}
	return filepath.Join(dir, name)
}

var cleanRE = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// supervisor runs the guest as its child, then deletes the cleanup entries
// and records "<code>" in exit. $1 is the guest dir, then cleanup names up
// to "--", then the guest argv. The guest's environment is the
// supervisor's: the caller's scrubbed Env. SIGTERM is passed on to the
// guest and the supervisor stays to reap it, so a stopped guest leaves no
// zombie behind whoever its parent is. It waits again only when a signal
// interrupted the wait (t set by the trap), never by probing the pid, which
// another process may have been given.
const supervisor = `d=$1; shift
while [ "$1" != "--" ]; do c="$c $1"; shift; done; shift
trap 't=1; kill -TERM "$p" 2>/dev/null' TERM INT HUP
"$@" </dev/null &
p=$!
while :; do t=; wait "$p"; code=$?; [ -n "$t" ] || break; done
for f in $c; do rm -rf -- "$d/$f"; done
echo "$code" >"$d/exit.tmp" && mv -f "$d/exit.tmp" "$d/exit"
`

// supervisorName is the supervisor's $0: with the guest dir after it, what SupervisorOf
// finds it by.
const supervisorName = "socialweb-guest"

var (
	reapMu  sync.Mutex
	reapers = map[int]*Child{}
)

// Child is a guest this process started, and reaps.
type Child struct {
	Record
	done chan struct{}
	err  error // cmd.Wait's, set before done is closed
}

// Done is closed when the leader has exited and been reaped.
func (c *Child) Done() <-chan struct{} { return c.done }

// Err is how the leader ended ("exit status 1", "signal: killed"; nil for
// status 0), once Done is closed.
func (c *Child) Err() error {
	<-c.done
	return c.err
}

// Stop ends the child's process group as StopGroup does; after the leader
// has ended by itself, it kills what is left of the group, if anything.
func (c *Child) Stop(ctx context.Context, grace time.Duration) error {
	select {
	case <-c.done:
		if len(GroupMembers(c.PID, false)) == 0 {
			return nil // nothing left, and the pgid may be free for reuse
		}
	default:
	}
	return StopGroup(ctx, c.Record, grace)
}

// Start launches the guest under the supervisor in a new session (and so a
// new process group), stdout and stderr appended to the log, and writes the
// pid file. The child is reaped by a goroutine of this process; if this
// process ends first, the guest runs on and its supervisor still records
// the exit status.
func Start(o StartOptions) (Record, error) {
	c, err := Spawn(o)
	if err != nil {
		return Record{}, err
	}
	return c.Record, nil
}

// Spawn is Start, returning the child to wait on.
func Spawn(o StartOptions) (*Child, error) {
	if len(o.Argv) == 0 || !filepath.IsAbs(o.Argv[0]) {
		return nil, fmt.Errorf("guest command %q: want an absolute path", o.Argv)
	}
	if o.Direct && len(o.Cleanup) > 0 {
		return nil, errors.New("a direct guest has no supervisor to clean up after it")
	}
	name, args := "/bin/sh", []string{"-c", supervisor, supervisorName, o.Dir}
	for _, c := range o.Cleanup {
		if !cleanRE.MatchString(c) {
			return nil, fmt.Errorf("cleanup entry %q", c)
		}
		args = append(args, c)
	}
	args = append(args, "--")
	args = append(args, o.Argv...)
	if o.Direct {
		name, args = o.Argv[0], o.Argv[1:]
	}
	logf, err := os.OpenFile(o.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(name, args...)
	cmd.Env = o.Env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	cmd.Dir = o.Cwd
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: o.ParentDeathSignal}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pid := cmd.Process.Pid
	c := &Child{Record: Record{PID: pid, StartedAt: time.Now().UTC(), Direct: o.Direct}, done: make(chan struct{})}
	reapMu.Lock()
	reapers[pid] = c
	reapMu.Unlock()
	go func() {
		c.err = cmd.Wait()
		reapMu.Lock()
		delete(reapers, pid)
		reapMu.Unlock()
		close(c.done)
	}()
	if st, err := ReadStat(pid); err == nil {
		c.StartTicks = st.StartTicks
	}
	crashpoint.Hit(crashpoint.GuestAfterSpawn)
	if err := WriteJSON(o.pidFilePath(), c.Record); err != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-c.done
		return nil, err
	}
	return c, nil
}

// Stat is what we read of /proc/PID/stat.
type Stat struct {
	PID        int
	State      byte // R, S, D, Z, ...
	PPID       int
	PGID       int
	StartTicks uint64
	// CPU is the user+system CPU time the process has used.
	CPU time.Duration
}

// ReadStat parses /proc/pid/stat.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return parseStat(pid, b)
}

func parseStat(pid int, b []byte) (Stat, error) {
	// "pid (comm) S ppid pgrp session tty tpgid flags minflt cminflt majflt
	// cmajflt utime stime cutime cstime priority nice threads itrealvalue
	// starttime ..."; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	st := Stat{PID: pid, State: f[0][0]}
	st.PPID, _ = strconv.Atoi(f[1])
	st.PGID, _ = strconv.Atoi(f[2])
	st.StartTicks, _ = strconv.ParseUint(f[19], 10, 64)
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	st.CPU = time.Duration(utime+stime) * time.Second / 100 // USER_HZ
	return st, nil
}

// Alive reports whether the recorded supervisor still runs (not a zombie,
// and not a later process that got the same pid).
func (r Record) Alive() bool {
	if r.PID <= 0 {
		return false
	}
	st, err := ReadStat(r.PID)
	if err != nil || st.State == 'Z' || st.State == 'X' {
		return false
	}
	return r.StartTicks == 0 || st.StartTicks == r.StartTicks
}

// GroupMembers lists the pids of processes in process group pgid that are
// not zombies (withZombies: those too).
func GroupMembers(pgid int, withZombies bool) []int {
	var pids []int
	for _, st := range groupStats(pgid) {
		if !withZombies && (st.State == 'Z' || st.State == 'X') {
			continue
		}
		pids = append(pids, st.PID)
	}
	return pids
}

// procPIDs are the pids /proc lists now.
func procPIDs() []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// groupStats are the stats of the processes of group pgid, zombies included.
func groupStats(pgid int) []Stat {
	if pgid <= 1 {
		return nil
	}
	var out []Stat
	for _, pid := range procPIDs() {
		if st, err := ReadStat(pid); err == nil && st.PGID == pgid {
			out = append(out, st)
		}
	}
	return out
}

// GroupCPU is the user+system CPU time used so far by the processes of group pgid (a guest
// and its supervisor): what a boot cost, however long it waited for a CPU on a loaded host.
func GroupCPU(pgid int) time.Duration {
	var cpu time.Duration
	for _, pid := range GroupMembers(pgid, false) {
		if st, err := ReadStat(pid); err == nil {
			cpu += st.CPU
		}
	}
	return cpu
}

// KillGroup ends process group pgid, whose leader is the supervisor:
// SIGTERM to the group; after grace SIGKILL to every member but the leader
// (which then reaps the guest and exits); a grace later SIGKILL to the whole
// group. It returns when no member is left, zombies included when this
// process is the one that reaps the leader.
func KillGroup(ctx context.Context, pgid int, grace time.Duration) error {
	return killGroup(ctx, pgid, grace, false)
}

// StopGroup ends the process group that rec leads, as KillGroup does; when
// the leader is the guest itself (rec.Direct), the whole group is killed
// once grace has passed, or at once when the leader has exited (what is
// left lost its parent).
func StopGroup(ctx context.Context, rec Record, grace time.Duration) error {
	return killGroup(ctx, rec.PID, grace, rec.Direct)
}

func killGroup(ctx context.Context, pgid int, grace time.Duration, direct bool) error {
	if pgid <= 1 {
		return nil
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	start := time.Now()
	stage := 0
	for {
		members := GroupMembers(pgid, false)
		if len(members) == 0 {
			break
		}
		switch {
		case direct && stage < 2 && (time.Since(start) > grace || !slices.Contains(members, pgid)):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			stage = 2
		case stage == 0 && time.Since(start) > grace:
			for _, p := range members {
				if p != pgid {
					_ = syscall.Kill(p, syscall.SIGKILL)
				}
			}
			stage = 1
		case stage == 1 && time.Since(start) > 2*grace:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			stage = 2
		}
		select {
		case <-ctx.Done():
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	// Our own child: wait until the reaper has collected it.
	reapMu.Lock()
	child := reapers[pgid]
	reapMu.Unlock()
	if child != nil {
		select {
		case <-child.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// Members orphaned by a SIGKILL are reaped by init; give it a moment so
	// the group is gone from /proc, zombies included, when we return. Not for
	// a zombie whose parent is neither this process nor a member: a guest
	// adopted from a process that died (a bidder restarted after a crash) is
	// reaped by init on init's schedule, which can be seconds, and a zombie is
	// dead already.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && awaitedZombies(pgid) > 0; {
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// awaitedZombies counts the members of group pgid still in /proc that this
// process or another member will reap: every live member, and each zombie
// whose parent is this process or in the group.
func awaitedZombies(pgid int) int {
	members := groupStats(pgid)
	in := make(map[int]bool, len(members))
	for _, st := range members {
		in[st.PID] = true
	}
	self, n := os.Getpid(), 0
	for _, st := range members {
		if (st.State != 'Z' && st.State != 'X') || st.PPID == self || in[st.PPID] {
			n++
		}
	}
	return n
}

// Stop ends the guest in dir: records the stop unless the guest already
// ended by itself, then ends its process group. When the supervisor has
// recorded an exit and is gone, its group is not signalled: the guest was
// reaped, and the pgid may since belong to someone else.
func Stop(ctx context.Context, dir string, grace time.Duration) error {
	var rec Record
	_ = ReadJSON(filepath.Join(dir, PidFile), &rec)
	_, _, exited := Exit(dir)
	if !exited {
		if err := MarkStopped(dir); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				// The guest's directory went meanwhile: only an ended guest is removed
				// (RemoveEnded), so there is nothing left to stop.
				return nil
			}
			return err
		}
	}
	if rec.PID <= 0 {
		// No pid.json: the process that started the guest died between the spawn and that
		// write, or before the spawn. A supervisor spawned runs on in its own session, and
		// would run beside the guest booted again in its place: find it by its command line.
		if pid := SupervisorOf(dir); pid > 0 {
			return KillGroup(ctx, pid, grace)
		}
		return nil
	}
	if exited && !rec.Alive() {
		return nil
	}
	return KillGroup(ctx, rec.PID, grace)
}

// SupervisorOf is the pid of the live supervisor of the guest in dir (Start's, not Direct),
// found by its command line, or 0 when none runs. It is how a guest whose pid.json was never
// written is found.
func SupervisorOf(dir string) int {
	for _, pid := range procPIDs() {
		cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if len(args) < 5 || args[0] != "/bin/sh" || args[1] != "-c" || args[2] != supervisor || args[3] != supervisorName || args[4] != dir {
			continue
		}
		if st, err := ReadStat(pid); err == nil && st.State != 'Z' && st.State != 'X' {
			return pid
		}
	}
	return 0
}

// ReapStale ends the process group recorded in pidFile when its leader
// still runs (a guest left by an earlier run of this program, which did not
// stop it), as StopGroup does, and removes pidFile. It returns the record
// of the group it stopped, if any.
func ReapStale(ctx context.Context, pidFile string, grace time.Duration) (Record, bool, error) {
	var rec Record
	if err := ReadJSON(pidFile, &rec); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Record{}, false, nil
		}
		return Record{}, false, os.Remove(pidFile) // unreadable: nothing to recognise a guest by
	}
	if !rec.Alive() {
		return Record{}, false, ignoreNotExist(os.Remove(pidFile))
	}
	if err := StopGroup(ctx, rec, grace); err != nil {
		return rec, true, err
	}
	return rec, true, ignoreNotExist(os.Remove(pidFile))
}

func ignoreNotExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Exit reads the exit status the supervisor recorded.
func Exit(dir string) (code int, at time.Time, ok bool) {
	p := filepath.Join(dir, ExitFile)
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, time.Time{}, false
	}
	code, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, time.Time{}, false
	}
	if fi, err := os.Stat(p); err == nil {
		at = fi.ModTime().UTC()
	}
	return code, at, true
}

// MarkStopped records that Stop ended the guest (before it kills it, so a
// status read mid-stop already says Stopped).
func MarkStopped(dir string) error {
	p := filepath.Join(dir, StoppedFile)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	return os.WriteFile(p, []byte(time.Now().UTC().Format(time.RFC3339Nano)+"\n"), 0o600)
}

// Stopped reports whether MarkStopped was called, and when.
func Stopped(dir string) (time.Time, bool) {
	b, err := os.ReadFile(filepath.Join(dir, StoppedFile))
	if err != nil {
		return time.Time{}, false
	}
	t, _ := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
	return t, true
}

// Tail returns the last n lines of the file (all when n <= 0), reading at
// most the last 4 MiB.
func Tail(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	const maxRead = 4 << 20
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := fi.Size() - maxRead
	if off < 0 {
		off = 0
	}
	b, err := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return b, nil
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	cut := 0
	for i, lines := end-1, 0; i >= 0; i-- {
		if b[i] == '\n' {
			lines++
			if lines == n {
				cut = i + 1
				break
			}
		}
	}
	return b[cut:], nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
