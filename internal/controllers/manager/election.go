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

// newLeaseLock is controller-runtime's Lease lock (same identity form, hostname_uuid),
// wrapped so that a refused read or write of the Lease is reported instead of retried.
func newLeaseLock(cfg *rest.Config, ns string, report func(error)) (resourcelock.Interface, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("leader election identity: %w", err)
	}
	l, err := resourcelock.NewFromKubeconfig(resourcelock.LeasesResourceLock, ns, LeaderElectionID,
		resourcelock.ResourceLockConfig{Identity: host + "_" + string(uuid.NewUUID())}, cfg, RenewDeadline)
	if err != nil {
		return nil, fmt.Errorf("leader election lock: %w", err)
	}
	return guardedLock{Interface: l, report: report}, nil
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
