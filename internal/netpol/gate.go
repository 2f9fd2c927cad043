package netpol

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"log"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"socialweb.computer/internal/netpol/podgate"
)

// The enforcement process's side of the pod gate (package podgate): the node's CNI tells it
// a new pod's addresses before the pod's containers start, and waits until the rules
// written include them.

// learntTTL is how long addresses learnt for a pod the informers have not shown are kept:
// long past any informer's lag, short of filling memory with pods that never appeared.
const learntTTL = 2 * time.Minute

// learntAddrs are a pod's addresses as this node's CNI assigned them.
type learntAddrs struct {
	IPs []netip.Addr
	At  time.Time
	// Pod is the pod as read from the apiserver at the request, for as long as the
	// informer has not shown it (its watch trails the kubelet's by up to ~100 ms).
	Pod *corev1.Pod
}

// gate keeps what the CNI told and who waits for it.
type gate struct {
	mu      sync.Mutex
	seq     uint64 // of the last request
	learnt  map[types.UID]learntAddrs
	waiters map[uint64]gateWaiter
	wake    func() // marks the rules dirty
	// pressing is signalled with every wake for a request: the loop stops waiting out the
	// rewrite's rate limit for it.
	pressing chan struct{}
	// get reads a pod from the apiserver (nil: the informer alone tells).
	get func(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// shown says whether the informer shows the pod (its UID) already: then it tells, and
	// nothing is read (nil: every request's pod is read).
	shown func(namespace, name string, uid types.UID) bool
	// node is this node's name: a pod read for a request counts only when bound here.
	node string
}

type gateWaiter struct {
	uid  types.UID
	done chan struct{}
}

func newGate(wake func()) *gate {
	g := &gate{learnt: map[types.UID]learntAddrs{}, waiters: map[uint64]gateWaiter{}, pressing: make(chan struct{}, 1)}
	g.wake = func() {
		select {
		case g.pressing <- struct{}{}:
		default:
		}
		wake()
	}
	return g
}

// listen serves the gate on a unix socket at path (a stale one is replaced), readable and
// writable by root only, until ctx ends.
func (g *gate) listen(ctx context.Context, path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return err
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go g.handle(ctx, c)
		}
	}()
	return nil
}

// handle reads one request, registers it, and answers once the rules know the pod (or says
// why not); a client that goes away is forgotten.
func (g *gate) handle(ctx context.Context, c net.Conn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadBytes('\n')
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	answer := func(resp podgate.Response) {
		b, _ := json.Marshal(resp)
		_, _ = c.Write(append(b, '\n'))
	}
	var req podgate.Request
	if err := json.Unmarshal(line, &req); err != nil {
		answer(podgate.Response{Error: "a request is one JSON object on one line: " + err.Error()})
		return
	}
	if err := validRequest(req); err != nil {
		answer(podgate.Response{Error: err.Error()})
		return
	}
	t0 := time.Now()
	seq, done := g.add(req, t0)
	go g.read(ctx, req)
	// The client's end (EOF) is read in the background, so a plugin that timed out does
	// not leave its waiter behind.
	gone := make(chan struct{})
	go func() {
		_, _ = r.ReadByte()
		close(gone)
	}()
	select {
	case <-done:
		answer(podgate.Response{})
		log.Printf("netpol: pod %s/%s starts: the rules hold %v (%v after its CNI asked)", req.Namespace, req.Name, req.IPs, time.Since(t0).Round(10*time.Microsecond))
	case <-gone:
		g.forget(seq)
	case <-ctx.Done():
		g.forget(seq)
	}
}

// validRequest refuses a request that names no pod or no usable address.
func validRequest(req podgate.Request) error {
	if req.UID == "" {
		return errors.New("the request names no pod UID")
	}
	if len(req.IPs) == 0 {
		return errors.New("the request carries no address")
	}
	for _, a := range req.IPs {
		if !a.IsValid() || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() {
			return errors.New("the request carries an address no pod has: " + a.String())
		}
	}
	return nil
}

// add learns req's addresses and returns its sequence number and the channel closed when
// rules that include them are written.
func (g *gate) add(req podgate.Request, now time.Time) (uint64, chan struct{}) {
	g.mu.Lock()
	g.seq++
	seq := g.seq
	ips := slices.Clone(req.IPs)
	for i := range ips {
		ips[i] = ips[i].Unmap()
	}
	g.learnt[types.UID(req.UID)] = learntAddrs{IPs: ips, At: now}
	done := make(chan struct{})
	g.waiters[seq] = gateWaiter{uid: types.UID(req.UID), done: done}
	g.mu.Unlock()
	g.wake()
	return seq, done
}

// read fetches the request's pod from the apiserver when the informer does not show it yet,
// so the rules need not wait for the informer: kept with the learnt addresses when it is the
// request's pod (its UID) and bound to this node. A pod the informer shows is not read: a
// read copy counts only until the informer shows its UID (withReadPods, prune).
func (g *gate) read(ctx context.Context, req podgate.Request) {
	if g.get == nil || req.Namespace == "" || req.Name == "" {
		return
	}
	if g.shown != nil && g.shown(req.Namespace, req.Name, types.UID(req.UID)) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := g.get(ctx, req.Namespace, req.Name)
	if err != nil || string(p.UID) != req.UID || p.Spec.NodeName != g.node {
		return
	}
	kept, err := podForDecision(p)
	if err != nil {
		return
	}
	g.mu.Lock()
	l, ok := g.learnt[p.UID]
	if ok {
		l.Pod = kept.(*corev1.Pod)
		g.learnt[p.UID] = l
	}
	g.mu.Unlock()
	if ok {
		g.wake()
	}
}

func (g *gate) forget(seq uint64) {
	g.mu.Lock()
	delete(g.waiters, seq)
	g.mu.Unlock()
}

// waiting says whether a sandbox waits for the rules (the rewrite then skips the rate
// limit: a pod's start waits for it).
func (g *gate) waiting() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiters) > 0
}

// snapshot is the learnt addresses for a decision, the pods read for requests, and the last
// request they include.
func (g *gate) snapshot() (map[types.UID][]netip.Addr, []*corev1.Pod, uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[types.UID][]netip.Addr, len(g.learnt))
	var pods []*corev1.Pod
	for uid, l := range g.learnt {
		out[uid] = l.IPs
		if l.Pod != nil {
			pods = append(pods, l.Pod)
		}
	}
	return out, pods, g.seq
}

// withReadPods is the informer's pods and, of the pods read for requests, those it does not
// show yet (by UID).
func withReadPods(listed, read []*corev1.Pod) []*corev1.Pod {
	if len(read) == 0 {
		return listed
	}
	seen := make(map[types.UID]bool, len(listed))
	for _, p := range listed {
		seen[p.UID] = true
	}
	out := listed
	for _, p := range read {
		if !seen[p.UID] {
			out = append(out, p)
		}
	}
	return out
}

// release answers every request up to seq whose pod was in the input of the rules just
// written (or found unchanged): those rules decided the pod with its learnt addresses.
func (g *gate) release(seq uint64, in Input) {
	onNode := map[types.UID]bool{}
	for _, p := range in.Pods {
		if p.Spec.NodeName == in.NodeName {
			onNode[p.UID] = true
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for s, w := range g.waiters {
		if s <= seq && onNode[w.uid] {
			close(w.done)
			delete(g.waiters, s)
		}
	}
}

// prune drops the learnt addresses pruneLearnt says are done with, and the pods read for
// requests once the informer (listed, its pods alone) shows them: from then on it tells,
// deletion included.
func (g *gate) prune(listed []*corev1.Pod, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, uid := range pruneLearnt(g.learnt, listed, now) {
		delete(g.learnt, uid)
	}
	for _, p := range listed {
		if l, ok := g.learnt[p.UID]; ok && l.Pod != nil {
			l.Pod = nil
			g.learnt[p.UID] = l
		}
	}
}

// pruneLearnt lists the pods whose learnt addresses are no longer needed: the pod's status
// shows the same addresses (the apiserver's view has caught up), the pod finished, or it was
// never seen (or is gone) for learntTTL.
func pruneLearnt(learnt map[types.UID]learntAddrs, pods []*corev1.Pod, now time.Time) []types.UID {
	byUID := make(map[types.UID]*corev1.Pod, len(pods))
	for _, p := range pods {
		byUID[p.UID] = p
	}
	var out []types.UID
	for uid, l := range learnt {
		p, ok := byUID[uid]
		switch {
		case !ok:
			if now.Sub(l.At) >= learntTTL {
				out = append(out, uid)
			}
		case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
			out = append(out, uid)
		case sameAddrs(podIPs(p), l.IPs):
			out = append(out, uid)
		}
	}
	slices.Sort(out)
	return out
}

// sameAddrs says whether a and b hold the same addresses, in any order.
func sameAddrs(a, b []netip.Addr) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}
