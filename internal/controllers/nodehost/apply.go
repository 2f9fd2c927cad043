package nodehost

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/scale"
	"socialweb.computer/internal/tenant"
)

// apply carries out a decision: Provision creates claims, Release cordons nodes and deletes
// their claims, Hold does nothing. The outcome is recorded for the status.
func (r *Reconciler) apply(ctx context.Context, p *pass, w *tenantWatch, in scale.Input, d scale.Decision) error {
	reportUnfittable(w, d)
	counts := fmt.Sprintf("%d pending pod(s), %d Ready node(s), %d claim(s)", pending(in.Pods), len(in.Nodes), len(in.Claims))
	if n := len(d.Unfittable); n > 0 {
		counts += fmt.Sprintf("; %d pod(s) no new node can run get no node: %s", n, unfittable(d))
	}
	var provisioned []string
	switch d.Action {
	case scale.Provision:
		sizes := sizesOf(d, SettingsOf(p.cluster).SizeRange())
		var err error
		provisioned, err = r.provision(ctx, p, d.Provision, sizes, d.Replaces, d.MaxPrice)
		if err != nil {
			return err
		}
		names := make([]string, len(provisioned))
		for i, node := range provisioned {
			names[i] = fmt.Sprintf("%s (%s)", node, sizes[i])
		}
		what := ""
		if len(d.Replaces) > 0 && d.MaxPrice != nil {
			what = fmt.Sprintf(" to replace %s, at most %d %s an hour", strings.Join(d.Replaces, ", "), d.MaxPrice.Cost, d.MaxPrice.Currency)
		}
		p.outcome = outcome{acting: true, reason: ConditionReason(d.Reason),
			message: fmt.Sprintf("provisioning %d node(s) (%s)%s: %s; %s", d.Provision, strings.Join(names, ", "), what, d.Reason, counts)}
		r.Log.Info("nodehost_provision", "cluster", p.key.String(), "nodes", names, "replaces", d.Replaces, "reason", d.Reason)
	case scale.Release:
		if err := r.release(ctx, p, w, d); err != nil {
			return err
		}
		p.outcome = outcome{acting: true, reason: ConditionReason(d.Reason),
			message: fmt.Sprintf("releasing node(s) %s: %s; %s", strings.Join(d.Release, ", "), d.Reason, counts)}
		r.Log.Info("nodehost_release", "cluster", p.key.String(), "nodes", d.Release, "reason", d.Reason)
	case scale.Drain:
		var left drained
		for _, n := range d.Drain {
			o, err := drain(ctx, w, n)
			if err != nil {
				return err
			}
			left.add(o)
		}
		p.outcome = outcome{acting: true, reason: ConditionReason(d.Reason),
			message: fmt.Sprintf("draining node(s) %s (%s): %s; %s", strings.Join(d.Drain, ", "), left, d.Reason, counts)}
		r.Log.Info("nodehost_drain", "cluster", p.key.String(), "nodes", d.Drain, "pods", left.left, "refused", len(left.refused))
	default:
		message := d.Reason
		if d.Reason == scale.ReasonDraining {
			// Evictions a PodDisruptionBudget refused are asked again.
			var left drained
			var names []string
			for _, n := range in.Nodes {
				if n.Draining {
					o, err := drain(ctx, w, n.Name)
					if err != nil {
						return err
					}
					left.add(o)
					names = append(names, n.Name)
				}
			}
			message += fmt.Sprintf(" (%s: %s)", strings.Join(names, ", "), left)
		}
		p.outcome = outcome{reason: ConditionReason(d.Reason), message: message + "; " + counts}
	}
	if w != nil {
		// Nominated first, then opened: a node opens only once no nomination to it is
		// outstanding (open.go), which this pass's nominations are until a later pass
		// reads them back.
		ns := Nominations(in, d, provisioned)
		r.nominate(ctx, p, w, ns)
		open, recheck := NodesToOpen(in.Now, p.nodes, ns)
		if r.open(ctx, p, w, p.nodes, open) {
			recheck = OpenReadBack
		}
		p.openRecheck = min(recheck, OpenReadBack)
	}
	return nil
}

// EventComponent is the source of the Events the node host records in tenant clusters.
const EventComponent = "socialweb-nodehost"

// ReasonNotTriggerScaleUp is the reason of the Warning Event on a pending pod that no node the
// cluster could rent can run (the Cluster Autoscaler's name for it, so tools that watch for
// it find it).
const ReasonNotTriggerScaleUp = "NotTriggerScaleUp"

// reportUnfittable records a Warning Event on each pod of d.Unfittable whose reason is new
// since the last Event the watch recorded for it; a pod no longer unfittable is forgotten.
func reportUnfittable(w *tenantWatch, d scale.Decision) {
	if w == nil || w.events == nil {
		return
	}
	now := map[string]bool{}
	for _, name := range d.Unfittable {
		now[name] = true
		why := d.UnfittableWhy[name]
		if w.reported[name] == why {
			continue
		}
		ns, pod, ok := strings.Cut(name, "/")
		if !ok {
			continue
		}
		p, err := w.pods.Pods(ns).Get(pod)
		if err != nil {
			continue // gone since the decision read it
		}
		w.reported[name] = why
		w.events.Eventf(p, corev1.EventTypeWarning, ReasonNotTriggerScaleUp,
			"pod didn't trigger scale-up: no node the cluster rents can run it: %s", why)
	}
	for name := range w.reported {
		if !now[name] {
			delete(w.reported, name)
		}
	}
}

// unfittable names the first pods no node can run, each with why ("default/big: Insufficient
// cpu"), separated by "; ".
func unfittable(d scale.Decision) string {
	const shown = 5
	var parts []string
	for i, name := range d.Unfittable {
		if i == shown {
			parts = append(parts, fmt.Sprintf("and %d more", len(d.Unfittable)-shown))
			break
		}
		if why := d.UnfittableWhy[name]; why != "" {
			name += ": " + why
		}
		parts = append(parts, name)
	}
	return strings.Join(parts, "; ")
}

func pending(pods []scale.Pod) int {
	n := 0
	for _, p := range pods {
		if p.Unschedulable && p.Node == "" && !p.Finished && !p.Daemon {
			n++
		}
	}
	return n
}

// sizesOf are the sizes of the d.Provision nodes to rent: the simulation's, the cluster's
// smallest size for a node it did not size.
func sizesOf(d scale.Decision, r scale.SizeRange) []scale.Size {
	out := make([]scale.Size, d.Provision)
	for i := range out {
		out[i] = r.Min
		if i < len(d.Sizes) {
			out[i] = d.Sizes[i]
		}
	}
	return out
}

// provision creates n NodeClaims for the Cluster, each with a fresh node name and the size
// of sizes (one per node), and returns the node names, in order. A replacement's claim
// also names the nodes it replaces and the most it may cost.
func (r *Reconciler) provision(ctx context.Context, p *pass, n int, sizes []scale.Size, replaces []string, maxPrice *scale.Price) ([]string, error) {
	taken := map[string]bool{}
	for _, c := range p.claims {
		taken[c.Spec.NodeName] = true
	}
	var names []string
	for i := 0; i < n; i++ {
		node, err := NewNodeName()
		if err != nil {
			return names, err
		}
		if taken[node] {
			i--
			continue
		}
		taken[node] = true
		claim := &v1alpha1.NodeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.cluster.Namespace, Name: ClaimName(p.cluster.Name, node)},
			Spec: v1alpha1.NodeClaimSpec{ClusterRef: v1alpha1.ObjectRef{Name: p.cluster.Name}, NodeName: node,
				OwnerDid: p.cluster.Spec.Account, CPUs: sizes[i].CPUs, MemMiB: sizes[i].MemMiB, Replaces: replaces},
		}
		if maxPrice != nil {
			claim.Spec.MaxPrice = &v1alpha1.NodePrice{Cost: maxPrice.Cost, Currency: maxPrice.Currency}
		}
		if len(validation.IsValidLabelValue(p.cluster.Name)) == 0 {
			claim.Labels = map[string]string{v1alpha1.LabelInfraCluster: p.cluster.Name}
		}
		if err := r.Client.Create(ctx, claim); err != nil {
			return names, fmt.Errorf("creating NodeClaim %s: %w", claim.Name, err)
		}
		names = append(names, node)
	}
	return names, nil
}

// release cordons each node the decision releases (the scheduler places nothing more on
// it), then deletes its claim, only if it is still the claim the decision saw.
func (r *Reconciler) release(ctx context.Context, p *pass, w *tenantWatch, d scale.Decision) error {
	byName := map[string]*v1alpha1.NodeClaim{}
	for _, c := range p.claims {
		byName[c.Name] = c
	}
	for i, node := range d.Release {
		if err := cordon(ctx, w, node); err != nil {
			return err
		}
		c := byName[d.ReleaseClaims[i]]
		if c == nil || c.DeletionTimestamp != nil {
			continue
		}
		if err := deleteClaim(ctx, r.Client, c); err != nil {
			return err
		}
	}
	return nil
}

// cordon marks a tenant node unschedulable; a node already gone is fine.
func cordon(ctx context.Context, w *tenantWatch, node string) error {
	patch := []byte(`{"spec":{"unschedulable":true}}`)
	_, err := w.client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("cordoning node %s: %w", node, err)
	}
	return nil
}

// deleteClaim deletes a claim with its uid as precondition (a claim recreated under the
// same name is not the one decided on); gone already is fine.
func deleteClaim(ctx context.Context, c client.Client, claim *v1alpha1.NodeClaim) error {
	uid := claim.UID
	err := c.Delete(ctx, claim, client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting NodeClaim %s: %w", claim.Name, err)
	}
	return nil
}

// MaxEndedRetry bounds the growing retry delay of a cluster whose claims keep ending.
const MaxEndedRetry = 10 * time.Minute

// EndedDelay is how long a claim that ended holds its place when the cluster's claims have
// ended streak times before with no node running between: base, doubled for each, at most
// MaxEndedRetry (or base, when base is longer). A market that fails every claim is asked
// less and less often; a node that runs starts the streak again.
func EndedDelay(base time.Duration, streak int) time.Duration {
	d := base
	for range streak {
		if d >= MaxEndedRetry {
			break
		}
		d *= 2
	}
	return max(min(d, MaxEndedRetry), base)
}

// deleteEnded deletes the claims that ended (Failed, Lost) once they have been seen ended
// for the retry delay: they will never give a node, and the decision claims a node again if
// one is still needed. Until then they hold their place, so a market that fails every claim
// at once costs one claim per delay, not one per reconcile, and the delay doubles with each
// round of deletions until a claim of the cluster runs (EndedDelay). When each was first
// seen ended, and the streak, are kept in memory; a restart waits one base delay again. It
// returns how long until the next one is due (0: none).
func (r *Reconciler) deleteEnded(ctx context.Context, p *pass) (time.Duration, error) {
	now := r.now()
	seen, streak := r.ended.of(p.key, p.claims, now)
	delay := EndedDelay(r.endedRetry(), streak)
	deleted := false
	defer func() {
		if deleted {
			r.ended.lengthen(p.key)
		}
	}()
	var next time.Duration
	for _, c := range p.claims {
		since, ok := seen[c.UID]
		if !ok || c.DeletionTimestamp != nil {
			continue
		}
		if left := since.Add(delay).Sub(now); left > 0 {
			if next == 0 || left < next {
				next = left
			}
			continue
		}
		if err := deleteClaim(ctx, r.Client, c); err != nil {
			return 0, err
		}
		deleted = true
		r.Log.Info("nodehost_claim_ended", "cluster", p.key.String(), "claim", c.Name, "phase", c.Status.Phase, "held", delay)
	}
	return next, nil
}

// endedClaims remembers, per Cluster, when each claim was first seen ended, how many rounds
// of ended claims were deleted since a claim last came to run (the streak), and which
// claims were seen running.
type endedClaims struct {
	mu      sync.Mutex
	by      map[tenant.Key]map[types.UID]time.Time
	streak  map[tenant.Key]int
	running map[tenant.Key]map[types.UID]bool
}

// of records the claims that ended now and forgets the ones no longer there or no longer
// ended; it returns a copy, and the streak, which a claim seen running for the first time
// ends (a node that ran before the failures began does not: the market still fails the new
// ones).
func (e *endedClaims) of(k tenant.Key, claims []*v1alpha1.NodeClaim, now time.Time) (map[types.UID]time.Time, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running == nil {
		e.running = map[tenant.Key]map[types.UID]bool{}
	}
	running := map[types.UID]bool{}
	for _, c := range claims {
		if c.Status.Phase == v1alpha1.NodeClaimRunning {
			running[c.UID] = true
			if !e.running[k][c.UID] {
				delete(e.streak, k)
			}
		}
	}
	e.running[k] = running
	old := e.by[k]
	cur := map[types.UID]time.Time{}
	for _, c := range claims {
		if !ClaimEnded(c) {
			continue
		}
		if t, ok := old[c.UID]; ok {
			cur[c.UID] = t
		} else {
			cur[c.UID] = now
		}
	}
	if e.by == nil {
		e.by = map[tenant.Key]map[types.UID]time.Time{}
	}
	if len(cur) == 0 {
		delete(e.by, k)
	} else {
		e.by[k] = cur
	}
	out := make(map[types.UID]time.Time, len(cur))
	for u, t := range cur {
		out[u] = t
	}
	return out, e.streak[k]
}

// lengthen counts a round of ended claims deleted.
func (e *endedClaims) lengthen(k tenant.Key) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.streak == nil {
		e.streak = map[tenant.Key]int{}
	}
	e.streak[k]++
}

func (e *endedClaims) forget(k tenant.Key) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.by, k)
	delete(e.streak, k)
	delete(e.running, k)
}

// nodesOf counts the Cluster's claims whose node is joined (Ready in the tenant).
func nodesOf(claims []*v1alpha1.NodeClaim, joined map[string]bool) int32 {
	var n int32
	for _, c := range claims {
		if c.DeletionTimestamp == nil && !ClaimEnded(c) && joined[c.Spec.NodeName] {
			n++
		}
	}
	return n
}
