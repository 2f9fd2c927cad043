package manager

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaderElectionID names the Lease the replicas of `socialweb controllers` compete for.
const LeaderElectionID = "socialweb-controllers.socialweb.computer"

// Leader election timings. The leader renews every RetryPeriod and steps down (releasing
// the Lease) when it stops, so a graceful handover takes the old leader's shutdown plus one
// retry of the others (RetryPeriod with client-go's jitter: 1 to 2.2 s), well under 5 s. A
// leader that dies without stopping (kill -9, a lost node) is replaced once its Lease
// expires: LeaseDuration after the last renewal a waiting replica saw, at its next retry. A leader that cannot reach the API server
// for RenewDeadline gives up leadership and exits rather than risk two writers; 8 s rides
// out an API server restart behind a load balancer. Upstream's 15/10/2 s defaults make the
// handover 17-19 s for no gain here: one Lease renewed each second is nothing to a server.
const (
	LeaseDuration = 10 * time.Second
	RenewDeadline = 8 * time.Second
	RetryPeriod   = 1 * time.Second
)

// inClusterNamespace is where a pod's ServiceAccount namespace is mounted.
const inClusterNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// LeaderElectionNamespace is ns, or when empty the pod's own namespace in a cluster, or
// "default" elsewhere.
func LeaderElectionNamespace(ns string) string {
	if ns != "" {
		return ns
	}
	if b, err := os.ReadFile(inClusterNamespace); err == nil && strings.TrimSpace(string(b)) != "" {
		return strings.TrimSpace(string(b))
	}
	return "default"
}

// PodNameEnv and PodUIDEnv carry the pod's name and UID from the downward API
// (config/manager sets them). Together they name one pod for its whole life, across
// restarts of its container, and no other pod ever.
const (
	PodNameEnv = "POD_NAME"
	PodUIDEnv  = "POD_UID"
)

// leaseIdentity is the holder identity this process writes in the Lease. In a pod it is
// POD_NAME_POD_UID, the same for every run of the pod's container (perPod): a run finding
// that identity in the Lease knows the holder was an earlier run of this container, which
// the kubelet starts only after the earlier one ended, so that Lease is stale
// (releaseStaleLease). Elsewhere it is controller-runtime's hostname_uuid, new each run.
func leaseIdentity(getenv func(string) string, hostname func() (string, error)) (identity string, perPod bool, err error) {
	if name, uid := getenv(PodNameEnv), getenv(PodUIDEnv); name != "" && uid != "" {
		return name + "_" + uid, true, nil
	}
	host, err := hostname()
	if err != nil {
		return "", false, fmt.Errorf("leader election identity: %w", err)
	}
	return host + "_" + string(uuid.NewUUID()), false, nil
}

// newLeaseLock is controller-runtime's Lease lock with leaseIdentity, wrapped so that a
// refused read or write of the Lease is reported instead of retried.
func newLeaseLock(cfg *rest.Config, ns string, report func(error)) (lock resourcelock.Interface, perPod bool, err error) {
	identity, perPod, err := leaseIdentity(os.Getenv, os.Hostname)
	if err != nil {
		return nil, false, err
	}
	l, err := resourcelock.NewFromKubeconfig(resourcelock.LeasesResourceLock, ns, LeaderElectionID,
		resourcelock.ResourceLockConfig{Identity: identity}, cfg, RenewDeadline)
	if err != nil {
		return nil, false, fmt.Errorf("leader election lock: %w", err)
	}
	return guardedLock{Interface: l, report: report}, perPod, nil
}

// StaleLeaseYield is how long a run that released its container's stale Lease waits
// before it competes: past a waiting replica's next retry (RetryPeriod with client-go's
// jitter of 1.2, so at most 2.2 s), so that the replica whose caches are warm leads.
const StaleLeaseYield = RetryPeriod + RetryPeriod*12/10 + 300*time.Millisecond

// releaseStaleLease gives up the Lease when its holder is this pod's identity: an earlier
// run of this container held it and died without releasing it (kill -9, OOM, a panic).
// Without this the other replica would wait out the lease duration (about 11 s from the
// death); with it, it leads at its next retry. It reports whether it released the Lease.
// The release writes what client-go's own release does (no holder, a 1 s lease), against
// the resourceVersion it read, so a Lease that changed hands since is left alone.
func releaseStaleLease(ctx context.Context, lock resourcelock.Interface, log *slog.Logger) bool {
	ctx, cancel := context.WithTimeout(ctx, RenewDeadline/2)
	defer cancel()
	rec, _, err := lock.Get(ctx)
	if err != nil || !staleOwnLease(rec, lock.Identity()) {
		return false
	}
	now := metav1.NewTime(time.Now())
	if err := lock.Update(ctx, resourcelock.LeaderElectionRecord{LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now,
		LeaderTransitions: rec.LeaderTransitions}); err != nil {
		log.Warn("could not release the Lease an earlier run of this pod held; the other replicas wait for it to expire",
			"lease", lock.Describe(), "err", err)
		return false
	}
	log.Info("released the Lease an earlier run of this pod held", "lease", lock.Describe(), "identity", lock.Identity())
	return true
}

// staleOwnLease is whether rec is held by identity, which is only ever an earlier run of
// this container when this run has not acquired it yet.
func staleOwnLease(rec *resourcelock.LeaderElectionRecord, identity string) bool {
	return rec != nil && identity != "" && rec.HolderIdentity == identity
}

// WarnSingleReplica is said once by a process that reconciles without leader election
// against a shared API server: two such replicas would both write every object. When a
// live Lease shows a replica with --leader-elect is running, the warning names it.
func WarnSingleReplica(ctx context.Context, cfg *rest.Config, ns string, log *slog.Logger) {
	const msg = "leader election is off: run only one replica of the controllers against this API server (--leader-elect for more)"
	holder, age := liveHolder(ctx, cfg, LeaderElectionNamespace(ns))
	if holder == "" {
		log.Warn(msg)
		return
	}
	log.Warn(msg, "runningLeader", holder, "lease", LeaderElectionNamespace(ns)+"/"+LeaderElectionID, "renewedAgo", age.Round(time.Second).String())
}

// liveHolder is the holder of the controllers' Lease when it was renewed within its
// duration; "" when there is none, or the Lease cannot be read (the warning stays generic).
func liveHolder(ctx context.Context, cfg *rest.Config, ns string) (string, time.Duration) {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 5 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", 0
	}
	lease, err := cs.CoordinationV1().Leases(ns).Get(ctx, LeaderElectionID, metav1.GetOptions{})
	if err != nil {
		return "", 0
	}
	return leaseHolder(lease.Spec.HolderIdentity, lease.Spec.RenewTime, lease.Spec.LeaseDurationSeconds, time.Now())
}

// leaseHolder decides whether a Lease's holder is live at now.
func leaseHolder(holder *string, renew *metav1.MicroTime, durationSeconds *int32, now time.Time) (string, time.Duration) {
	if holder == nil || *holder == "" || renew == nil {
		return "", 0
	}
	d := LeaseDuration
	if durationSeconds != nil {
		d = time.Duration(*durationSeconds) * time.Second
	}
	age := now.Sub(renew.Time)
	if age > d {
		return "", 0
	}
	return *holder, age
}
