package tenant

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"socialweb.computer/internal/atomicfile"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/tenant/gate"
)

// Key names a Cluster object.
type Key struct{ Namespace, Name string }

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// State is what the manager knows of one cluster's control plane.
type State string

const (
	StateStopped  State = "Stopped"
	StateStarting State = "Starting"
	StateReady    State = "Ready"
	StateCrashed  State = "Crashed" // exited unasked; restarting after a backoff
	StateStopping State = "Stopping"
)

// Status of one cluster's control plane.
type Status struct {
	State    State
	Server   string // the gate's URL
	Instance string // changes at every start of the child process
	PID      int
	Restarts int
	LastExit string // how the previous child ended, when it ended unasked
	ReadyAt  time.Time
	// Policy is what the control plane's floor enforces on every pod (the operator's floor,
	// tightened by the owner's choices).
	Policy PodPolicy
}

// StartOptions are what a cluster's owner chose for its control plane.
type StartOptions struct {
	// PodSecurity is the owner's level; the manager's floor applies when it is looser.
	PodSecurity PodSecurityLevel
	// PodUserNamespaces is the owner's choice; the manager's floor applies when it is
	// looser.
	PodUserNamespaces PodUserNamespaces
}

// policy is what the owner chose.
func (o StartOptions) policy() PodPolicy {
	return PodPolicy{Level: o.PodSecurity, UserNamespaces: o.PodUserNamespaces}
}

// Config of a Manager.
type Config struct {
	// Root holds one directory per cluster (Layout).
	Root string
	// Binary is the socialweb binary whose `kube controlplane` the child runs.
	Binary string
	// Advertise is the apiserver's advertise address: non-loopback (see netns.go).
	Advertise net.IP
	// PublicAddress, when set, is an IPv4 address of this host that nodes on other hosts
	// reach: every cluster's gate listens there too, on its own port, its serving
	// certificate names it, and node bundles name it as their server (a node bidder on
	// another host dials it; this host's own node bidder accepts it as its local gate).
	// Unset: gates listen on loopback only and nodes join from this host alone.
	PublicAddress net.IP
	// ChildEnv is added to the child's environment (e.g. GOGC, GOMEMLIMIT for experiments;
	// the child lowers its own heap target once idle, see ChildSpec).
	ChildEnv []string
	// DrainGrace is how long a deleted cluster's gate answers 503 before its processes are
	// stopped: requests in flight finish, clients see the cluster go. Default 250ms.
	DrainGrace time.Duration
	// StopTimeout bounds a graceful stop before the process group is killed. Default 20s.
	StopTimeout time.Duration
	// PodSecurity is the operator's floor for every cluster: baseline (the default) or
	// restricted. An owner may choose a stricter level, never a looser one.
	PodSecurity PodSecurityLevel
	// PodUserNamespaces is the operator's floor for every cluster: optional (the default)
	// or required. An owner may require them, never drop the requirement.
	PodUserNamespaces PodUserNamespaces
	Logger            *slog.Logger
}

// Manager runs the control planes of tenant clusters as supervised child processes, each
// in its own process group, each behind its gate.
type Manager struct {
	cfg    Config
	events chan Key

	mu       sync.Mutex
	clusters map[Key]*instance

	revokeNodesMu sync.Mutex // one read-modify-write of a revoked-nodes.json at a time
}

// NewManager returns a manager; nothing runs until Start.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.Root == "" || cfg.Binary == "" || cfg.Advertise == nil {
		return nil, errors.New("tenant manager: Root, Binary and Advertise are required")
	}
	if cfg.Advertise.IsLoopback() {
		return nil, fmt.Errorf("tenant manager: advertise address %s is loopback; the apiserver refuses it", cfg.Advertise)
	}
	if cfg.DrainGrace == 0 {
		cfg.DrainGrace = 250 * time.Millisecond
	}
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = 20 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	floor, err := ParsePodSecurityLevel(string(cfg.PodSecurity))
	if err != nil {
		return nil, fmt.Errorf("tenant manager: %w", err)
	}
	cfg.PodSecurity = floor
	if cfg.PodUserNamespaces, err = ParsePodUserNamespaces(string(cfg.PodUserNamespaces)); err != nil {
		return nil, fmt.Errorf("tenant manager: %w", err)
	}
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, err
	}
	return &Manager{cfg: cfg, events: make(chan Key, 1024), clusters: map[Key]*instance{}}, nil
}

// Events receives a cluster's key whenever its state changes on its own (ready, crashed,
// restarted), so a controller can requeue it.
func (m *Manager) Events() <-chan Key { return m.events }

func (m *Manager) notify(k Key) {
	select {
	case m.events <- k:
	default:
	}
}

// Layout of a cluster.
func (m *Manager) Layout(k Key) Layout { return LayoutFor(m.cfg.Root, k.Namespace, k.Name) }

// Status of a cluster; State is Stopped for one the manager does not run.
func (m *Manager) Status(k Key) Status {
	m.mu.Lock()
	in := m.clusters[k]
	m.mu.Unlock()
	if in == nil {
		return Status{State: StateStopped}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	s := in.status
	s.Server = in.gate.URL()
	return s
}

type ports struct {
	APIServer int `json:"apiserver"`
	Gate      int `json:"gate"`
}

type instance struct {
	key    Key
	layout Layout
	pki    *PKI
	ports  ports
	gate   *gate.Gate
	egress *egress
	// revokedNodes are the cluster's released node names, for the gate's tunnels.
	revokedNodes *RevokedNodesFile

	revokeMu sync.Mutex // one ApplyRevocations at a time
	// direct are the connections of AdminConfig clients, which reach the apiserver without
	// the gate: a stop closes them, or their watches hold the apiserver's graceful stop
	// until the child's 20 s deadline.
	direct connTracker

	mu      sync.Mutex
	status  Status
	asleep  bool          // stopped by Sleep, not started since (sleep.go)
	wake    bool          // a client came through the asleep gate since
	stop    chan struct{} // closed to ask the supervisor to stop
	stopped chan struct{} // closed when the supervisor has reaped its child
}

// Start makes sure the cluster's control plane runs (idempotent): directory, PKI, ports,
// gate, then the supervised child. It returns at once; Status reports Starting until the
// apiserver is ready and the default namespaces list. A control plane running with another
// pod policy than o asks for (with the floor applied) is restarted with it.
func (m *Manager) Start(k Key, o StartOptions) (Status, error) {
	policy := m.policy(o)
	in, err := m.ensure(k, policy)
	if err != nil {
		return Status{}, err
	}
	in.mu.Lock()
	applied := in.status.Policy
	in.mu.Unlock()
	if applied != policy {
		// The apiserver reads its admission configuration once: a new policy is a restart.
		if err := writeAdmissionConfig(in.layout, policy); err != nil {
			return Status{}, err
		}
		m.halt(in)
		in.mu.Lock()
		in.status.Policy = policy
		in.mu.Unlock()
	}
	in.mu.Lock()
	woken := in.asleep
	in.asleep, in.wake = false, false
	if in.stop == nil {
		in.stop, in.stopped = make(chan struct{}), make(chan struct{})
		in.status.State = StateStarting
		if !woken || in.gate.Mode() != gate.Asleep {
			in.gate.Set(gate.Serving, "")
		} // else the gate holds its clients until the apiserver is ready (awaitReady)
		go m.supervise(in, in.stop, in.stopped)
	}
	in.mu.Unlock()
	return m.Status(k), nil
}

// policy is the pod policy a cluster started with o runs: the operator's floor tightened by
// the owner's choices.
func (m *Manager) policy(o StartOptions) PodPolicy {
	return Tighten(PodPolicy{Level: m.cfg.PodSecurity, UserNamespaces: m.cfg.PodUserNamespaces}, o.policy())
}

// ensure prepares a cluster's directory, PKI, ports, admission configuration and gate.
func (m *Manager) ensure(k Key, policy PodPolicy) (*instance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if in := m.clusters[k]; in != nil {
		return in, nil
	}
	l := m.Layout(k)
	for _, d := range []string{l.Dir, l.Kubeconfigs()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), m.cfg.Advertise, firstServiceIP()}
	if m.cfg.PublicAddress != nil {
		ips = append(ips, m.cfg.PublicAddress)
	}
	p, err := EnsurePKI(l.PKI(), ips, ServingDNSNames)
	if err != nil {
		return nil, err
	}
	pr, err := leasePorts(l.Ports())
	if err != nil {
		return nil, err
	}
	api := fmt.Sprintf("https://127.0.0.1:%d", pr.APIServer)
	for _, n := range []string{"controller-manager", "scheduler"} {
		b, err := kubeconfigFiles(n, api, p.Cert("ca"), p.Cert(n), p.Key(n))
		if err == nil {
			err = atomicfile.Write(filepath.Join(l.Kubeconfigs(), n+".kubeconfig"), b, 0o600)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := atomicfile.Write(l.AuditPolicy(), []byte(auditPolicy), 0o600); err != nil {
		return nil, err
	}
	if err := m.writeSpec(l, p, pr); err != nil {
		return nil, err
	}
	if err := writeAdmissionConfig(l, policy); err != nil {
		return nil, err
	}
	if err := writeEgressSelectorConfig(l); err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(p.Cert("apiserver"), p.Key("apiserver"))
	if err != nil {
		return nil, err
	}
	g, err := gate.Listen(fmt.Sprintf("127.0.0.1:%d", pr.Gate), fmt.Sprintf("127.0.0.1:%d", pr.APIServer), cert)
	if err != nil {
		return nil, fmt.Errorf("gate on its leased port %d: %w", pr.Gate, err)
	}
	if m.cfg.PublicAddress != nil {
		if _, err := g.AlsoListen(net.JoinHostPort(m.cfg.PublicAddress.String(), strconv.Itoa(pr.Gate))); err != nil {
			g.Close()
			return nil, fmt.Errorf("gate on the public address %s, port %d: %w", m.cfg.PublicAddress, pr.Gate, err)
		}
	}
	reapStale(l, m.cfg.Logger)
	in := &instance{key: k, layout: l, pki: p, ports: pr, gate: g, status: Status{State: StateStopped, Policy: policy},
		revokedNodes: NewRevokedNodesFile(l.RevokedNodes())}
	if in.egress, err = m.startEgress(in, cert); err != nil {
		g.Close()
		return nil, err
	}
	m.wakeOnRequest(in)
	m.clusters[k] = in
	return in, nil
}

// writeSpec writes the child's spec from the cluster's PKI, ports and revocation state.
func (m *Manager) writeSpec(l Layout, p *PKI, pr ports) error {
	rev, err := LoadRevocations(l)
	if err != nil {
		return err
	}
	_, pub := serviceAccountKeyFiles(p.Dir)
	kid, err := KeyIDOfFile(pub)
	if err != nil {
		return err
	}
	spec, _ := json.MarshalIndent(BuildSpec(l, p, pr.APIServer, m.cfg.Advertise, rev, kid, time.Now()), "", "  ")
	return atomicfile.Write(l.Spec(), spec, 0o600)
}

// ApplyRevocations makes the revoked identities' tokens stop working in the cluster
// (revocation.go): for each DID not applied yet, what it made is read from the audit log
// and its tokens are denied, and the service-account signing key is rotated. A running
// control plane is stopped first (so nothing is issued between the read and the new key),
// and started again with the new spec: a restart of a second or two, the gate answering
// 503 meanwhile. It reports whether it restarted. Already applied: nothing happens. o is
// what Start is given.
func (m *Manager) ApplyRevocations(k Key, revoked []string, o StartOptions) (bool, error) {
	if len(revoked) == 0 {
		return false, nil
	}
	in, err := m.ensure(k, m.policy(o))
	if err != nil {
		return false, err
	}
	in.revokeMu.Lock()
	defer in.revokeMu.Unlock()
	st, err := LoadRevocations(in.layout)
	if err != nil {
		return false, err
	}
	dids := st.Unapplied(revoked)
	if len(dids) == 0 {
		return false, nil
	}
	in.mu.Lock()
	running := in.stop != nil
	in.mu.Unlock()
	if running {
		// The gate answers 503 meanwhile and closes its connections: the apiserver's
		// graceful stop waits for open requests (watches included), and clients
		// reconnect to the new one.
		in.gate.Set(gate.Unavailable, fmt.Sprintf("cluster %s is restarting to apply a revocation", k.Name))
		m.halt(in)
	}
	events, err := ReadAuditLogs(in.layout)
	if err != nil {
		return false, err
	}
	attributed := map[string]Attribution{}
	for _, d := range dids {
		attributed[d] = Attribute(events, d)
		m.cfg.Logger.Info("tenant_identity_revoked", "cluster", k.String(), "did", d, "made", describeAttribution(attributed[d]))
	}
	now := time.Now()
	if st, err = applyRevocations(in.layout, st, dids, attributed, now); err != nil {
		return false, err
	}
	if err := saveRevocations(in.layout, st); err != nil {
		return false, err
	}
	if err := m.writeSpec(in.layout, in.pki, in.ports); err != nil {
		return false, err
	}
	if running {
		if _, err := m.Start(k, o); err != nil {
			return false, err
		}
	}
	return running, nil
}

// leasePorts reads the cluster's ports, leasing free loopback ports for those missing or
// now taken by someone else.
func leasePorts(path string) (ports, error) {
	var p ports
	if b, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(b, &p)
	}
	changed := false
	for _, port := range []*int{&p.APIServer, &p.Gate} {
		if *port != 0 && portFree(*port) {
			continue
		}
		n, err := freePort()
		if err != nil {
			return p, err
		}
		*port, changed = n, true
	}
	if changed {
		b, _ := json.Marshal(p)
		if err := atomicfile.Write(path, b, 0o600); err != nil {
			return p, err
		}
	}
	return p, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func portFree(port int) bool {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// reapStale stops the process group of a child left by a previous manager that did not stop
// it (a crash of the parent), recognised by its pid file.
func reapStale(l Layout, log *slog.Logger) {
	rec, found, err := guestproc.ReapStale(context.Background(), l.PIDFile(), staleGrace)
	if found {
		log.Warn("stopped a tenant control plane left running by an earlier process", "pid", rec.PID, "dir", l.Dir)
	}
	if err != nil {
		log.Warn("stale tenant control plane", "dir", l.Dir, "err", err)
	}
}

// staleGrace is how long a stale child has to stop before its process group is killed.
const staleGrace = 10 * time.Second

// supervise runs the child until stop is closed, restarting it with backoff when it exits
// unasked.
func (m *Manager) supervise(in *instance, stop, stopped chan struct{}) {
	defer close(stopped)
	log := m.cfg.Logger.With("cluster", in.key.String())
	backoff := time.Second
	for {
		started := time.Now()
		child, err := m.spawn(in)
		if err != nil {
			in.setExit(fmt.Sprintf("could not start: %v", err))
			m.notify(in.key)
		} else {
			readyCtx, cancelReady := context.WithCancel(context.Background())
			go m.awaitReady(readyCtx, in, child.PID)
			select {
			case <-stop:
				cancelReady()
				m.stopChild(in, child, log)
				return
			case <-child.Done():
				cancelReady()
				_ = child.Stop(context.Background(), 0) // anything left in its group
				in.setExit(describeExit(child.Err(), in.layout))
				log.Warn("tenant control plane exited; restarting", "exit", describeExit(child.Err(), in.layout), "backoff", backoff)
				m.notify(in.key)
			}
			if time.Since(started) > time.Minute {
				backoff = time.Second
			}
		}
		select {
		case <-stop:
			return
		case <-time.After(backoff):
		}
		if backoff *= 2; backoff > 30*time.Second {
			backoff = 30 * time.Second
		}
		in.mu.Lock()
		in.status.State = StateStarting
		in.mu.Unlock()
		m.notify(in.key)
	}
}

func (in *instance) setExit(msg string) {
	in.mu.Lock()
	in.status.State = StateCrashed
	in.status.LastExit = msg
	in.status.Restarts++
	in.status.PID = 0
	in.mu.Unlock()
}

func describeExit(err error, l Layout) string {
	s := "exited with status 0"
	if err != nil {
		s = err.Error()
	}
	if tail := lastLine(l.Log()); tail != "" {
		s += ": " + tail
	}
	return s
}

// lastLine is the last non-empty line of a log, shortened: the child's reason, usually.
func lastLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, _ := f.Stat()
	off := max(st.Size()-4096, 0)
	buf := make([]byte, st.Size()-off)
	_, _ = f.ReadAt(buf, off)
	lines := strings.Split(strings.TrimSpace(string(buf)), "\n")
	l := strings.TrimSpace(lines[len(lines)-1])
	if len(l) > 300 {
		l = l[:300]
	}
	return l
}

func (m *Manager) spawn(in *instance) (*guestproc.Child, error) {
	env := append(append(childBaseEnv(), StartEnv...), m.cfg.ChildEnv...)
	child, err := startControlPlane(in.layout, m.cfg.Binary, env)
	if err != nil {
		return nil, err
	}
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	in.mu.Lock()
	in.status.PID = child.PID
	in.status.Instance = fmt.Sprintf("%s-%d", hex.EncodeToString(id), child.PID)
	in.status.State = StateStarting
	in.mu.Unlock()
	return child, nil
}

// startControlPlane starts the control plane of the cluster in l: its own session and
// process group, so that a stop reaches everything it started; its pid (the control plane's
// own: Status.Instance names it) in the pid file, for a later manager's reapStale; and a
// parent that dies takes it along rather than leaving it serving unsupervised.
func startControlPlane(l Layout, binary string, env []string) (*guestproc.Child, error) {
	bin, err := exec.LookPath(binary)
	if err == nil {
		bin, err = filepath.Abs(bin)
	}
	if err != nil {
		return nil, err
	}
	return guestproc.Spawn(guestproc.StartOptions{
		Dir: l.Dir, Log: l.Log(), PidFile: l.PIDFile(), Cwd: l.Dir, Env: env,
		Argv:   []string{bin, "kube", "controlplane", "--spec", l.Spec()},
		Direct: true, ParentDeathSignal: syscall.SIGTERM,
	})
}

// StartEnv is added to every child's environment; empty, the child's runtime keeps its
// defaults (the spec's apiserverStartGCPercent raises GOGC for the apiserver's start only).
// A GOGC for the whole start, measured with `socialweb bench tenant` on a loaded 2-core
// machine (5 clusters), before that setting existed:
//
//	start at           create->Ready  up->Ready  CPU to Ready (up)  idle anon  idle PSS
//	GOGC=100 (chosen)  3.60 s         3.81 s     2.35 s             169 MiB    187 MiB
//	GOGC=400           3.20 s         2.40 s     1.72 s             193 MiB    213 MiB
//	GOGC=off           3.60 s         3.00 s     1.80 s             222 MiB    241 MiB
//
// A relaxed collector starts faster but leaves the idle control plane larger (its
// long-lived objects end up spread over pages the start filled with garbage, which the
// non-moving collector cannot compact); density is kept. Config.ChildEnv overrides it.
var StartEnv []string

// childBaseEnv is the parent's environment without what would change the child's Go runtime
// or make it resolve names through a proxy.
func childBaseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch strings.ToUpper(k) {
		case "GOGC", "GOMEMLIMIT", "GODEBUG", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// stopChild asks the child to stop (it stops its controllers, then its apiserver, then its
// store), and kills its process group if it has not exited within StopTimeout.
func (m *Manager) stopChild(in *instance, child *guestproc.Child, log *slog.Logger) {
	in.mu.Lock()
	in.status.State = StateStopping
	in.mu.Unlock()
	// Until it has exited, close the direct connections (again: a client may reconnect
	// while the apiserver still accepts).
	stopped := make(chan struct{})
	go func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			in.direct.closeAll()
			select {
			case <-stopped:
				return
			case <-tick.C:
			}
		}
	}()
	t0 := time.Now()
	_ = child.Stop(context.Background(), m.cfg.StopTimeout)
	close(stopped)
	if time.Since(t0) > m.cfg.StopTimeout {
		log.Warn("tenant control plane did not stop in time; its process group was killed", "pid", child.PID)
	}
	in.mu.Lock()
	in.status.State = StateStopped
	in.status.PID = 0
	in.mu.Unlock()
}

// Stop stops a cluster's processes and keeps its store (running: false). The gate stays,
// answering 503. Blocks until the process group is reaped.
func (m *Manager) Stop(k Key) error {
	in := m.get(k)
	if in == nil {
		return nil
	}
	in.gate.Set(gate.Unavailable, fmt.Sprintf("cluster %s is not running (spec.running is false)", k.Name))
	m.halt(in)
	return nil
}

// Drain is a deleted cluster's teardown before its store goes: the gate answers 503 at once,
// then (after DrainGrace) the processes are stopped, then the gate answers 502. Blocks until
// the process group is reaped.
func (m *Manager) Drain(k Key) {
	in := m.get(k)
	if in == nil {
		return
	}
	in.gate.Set(gate.Draining, fmt.Sprintf("cluster %s is being deleted", k.Name))
	in.mu.Lock()
	running := in.stop != nil
	in.mu.Unlock()
	if running {
		time.Sleep(m.cfg.DrainGrace)
	}
	m.halt(in)
	in.gate.Set(gate.Reaped, fmt.Sprintf("cluster %s was deleted", k.Name))
}

// Remove closes a cluster's gate and deletes its directory, store included. The processes
// must be stopped (Drain) first.
func (m *Manager) Remove(k Key) error {
	m.mu.Lock()
	in := m.clusters[k]
	delete(m.clusters, k)
	m.mu.Unlock()
	if in != nil {
		m.halt(in)
		in.gate.Close()
		in.egress.close()
	}
	l := m.Layout(k)
	reapStale(l, m.cfg.Logger)
	if err := os.RemoveAll(l.Dir); err != nil {
		return err
	}
	_ = os.Remove(filepath.Dir(l.Dir)) // the namespace directory, when it was the last
	return nil
}

// Shutdown stops every control plane (the stores are kept) and closes the gates: the
// manager's process is exiting.
func (m *Manager) Shutdown() {
	m.mu.Lock()
	all := make([]*instance, 0, len(m.clusters))
	for _, in := range m.clusters {
		all = append(all, in)
	}
	m.clusters = map[Key]*instance{}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, in := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in.gate.Set(gate.Unavailable, "the gateway is stopping")
			m.halt(in)
			in.gate.Close()
			in.egress.close()
		}()
	}
	wg.Wait()
}

func (m *Manager) get(k Key) *instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.clusters[k]
}

func (m *Manager) halt(in *instance) {
	in.mu.Lock()
	stop, stopped := in.stop, in.stopped
	in.stop, in.stopped = nil, nil
	in.mu.Unlock()
	if stop == nil {
		return
	}
	close(stop)
	<-stopped
	in.mu.Lock()
	in.status.State = StateStopped
	in.status.PID = 0
	in.mu.Unlock()
}

// connTracker dials and remembers connections until they close, so that they can all be
// closed at once.
type connTracker struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func (t *connTracker) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, t: t}
	t.mu.Lock()
	if t.conns == nil {
		t.conns = map[net.Conn]struct{}{}
	}
	t.conns[tc] = struct{}{}
	t.mu.Unlock()
	return tc, nil
}

func (t *connTracker) closeAll() {
	t.mu.Lock()
	all := make([]net.Conn, 0, len(t.conns))
	for c := range t.conns {
		all = append(all, c)
	}
	t.mu.Unlock()
	for _, c := range all {
		_ = c.Close()
	}
}

type trackedConn struct {
	net.Conn
	t    *connTracker
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}
