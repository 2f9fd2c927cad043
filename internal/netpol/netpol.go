// Package netpol enforces NetworkPolicy on a tenant cluster's node (`socialweb kube
// netpol`, started by the node agent beside the kubelet, inside the node's network
// namespace).
//
// It reads the cluster's NetworkPolicies, Pods and Namespaces through informers, decides
// what each of this node's pods may receive and send (Decide, pure), and programs that into
// one nftables table of the node's namespace (fill) through sigs.k8s.io/knftables, which
// runs the nft binary. The rules are kernel-only: with the process stopped they stay as
// last written, so a restart never opens a pod.
//
// It runs with the node's own credentials (system:node:<name>); the tenant control plane
// grants the group system:nodes read of pods, namespaces and network policies for it
// (internal/tenant/kube, the bootstrap hooks).
package netpol

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/knftables"

	"socialweb.computer/internal/netpol/podgate"
)

// Options configure one node's enforcement.
type Options struct {
	// Kubeconfig is the node's kubeconfig (its client certificate).
	Kubeconfig string
	// NodeName is the node's name: only its own pods' traffic is decided here.
	NodeName string
	// MinInterval is the least time between two rewrites of the rules: a burst of
	// events (a Deployment scaling) makes one rewrite, not one per event.
	MinInterval time.Duration
	// Resync rewrites the rules this often even without events, so a table changed
	// or removed by anything else is restored.
	Resync time.Duration
	// GateSocket, when set, is the unix socket the node's CNI asks on before a new pod's
	// containers start (package podgate): its addresses are in the rules when it answers.
	GateSocket string
}

// Run enforces NetworkPolicy until ctx ends.
func Run(ctx context.Context, o Options) error {
	if o.Kubeconfig == "" || o.NodeName == "" {
		return errors.New("netpol: --kubeconfig and --node-name are required")
	}
	if o.MinInterval <= 0 {
		o.MinInterval = 200 * time.Millisecond
	}
	if o.Resync <= 0 {
		o.Resync = time.Minute
	}
	nft, err := knftables.New(knftables.InetFamily, TableName)
	if err != nil {
		return fmt.Errorf("netpol: nftables in this network namespace: %w (the node needs the nft binary and nf_tables)", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return fmt.Errorf("netpol: kubeconfig %s: %w", o.Kubeconfig, err)
	}
	cfg.UserAgent = "socialweb-netpol/" + o.NodeName
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}

	f := informers.NewSharedInformerFactory(cs, 0)
	policies := f.Networking().V1().NetworkPolicies()
	pods := f.Core().V1().Pods()
	namespaces := f.Core().V1().Namespaces()
	dirty := make(chan struct{}, 1)
	mark := func() {
		select {
		case dirty <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { mark() },
		UpdateFunc: func(any, any) { mark() },
		DeleteFunc: func(any) { mark() },
	}
	// Every node keeps every pod of the cluster: only what Decide reads.
	if err := pods.Informer().SetTransform(podForDecision); err != nil {
		return err
	}
	for _, inf := range []cache.SharedIndexInformer{policies.Informer(), pods.Informer(), namespaces.Informer()} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	g := newGate(mark)
	g.node = o.NodeName
	g.get = func(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
		return cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	g.shown = func(namespace, name string, uid types.UID) bool {
		p, err := pods.Lister().Pods(namespace).Get(name)
		return err == nil && p.UID == uid
	}
	if o.GateSocket != "" {
		// Served before the informers sync, so a sandbox's request waits here rather than
		// retrying its connection; it is answered once the rules know the pod.
		if err := g.listen(ctx, o.GateSocket); err != nil {
			return fmt.Errorf("netpol: the pod gate's socket %s: %w", o.GateSocket, err)
		}
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("netpol: the %v informer did not sync", typ)
		}
	}
	log.Printf("netpol: informers synced; enforcing for node %s in table inet %s", o.NodeName, TableName)

	read := func() (Input, uint64, error) {
		learnt, readPods, seq := g.snapshot()
		in := Input{NodeName: o.NodeName, Learnt: learnt}
		var err error
		if in.Policies, err = policies.Lister().List(labels.Everything()); err != nil {
			return in, seq, err
		}
		if in.Pods, err = pods.Lister().List(labels.Everything()); err != nil {
			return in, seq, err
		}
		g.prune(in.Pods, time.Now())
		in.Pods = withReadPods(in.Pods, readPods)
		in.Namespaces, err = namespaces.Lister().List(labels.Everything())
		return in, seq, err
	}
	limit := rate.NewLimiter(rate.Every(o.MinInterval), 1)
	resync := time.NewTicker(o.Resync)
	defer resync.Stop()
	var applied string
	retry := time.Duration(0)
	mark()
	for {
		force := false
		var retryC <-chan time.Time
		if retry > 0 {
			retryC = time.After(retry)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-dirty:
		case <-retryC:
			force = true
		case <-resync.C:
			force = true
		}
		// A sandbox waiting at the gate is a pod's start: its rewrite neither waits for the
		// limit nor counts against it, whether the sandbox was waiting already or came
		// during the wait (a burst of pod starts must not hold a policy change back).
		if g.waiting() {
			select {
			case <-g.pressing:
			default:
			}
		} else if r := limit.Reserve(); r.Delay() > 0 {
			select {
			case <-ctx.Done():
				r.Cancel()
				return nil
			case <-time.After(r.Delay()):
			case <-g.pressing:
				r.Cancel()
			}
		}
		in, seq, err := read()
		if err != nil {
			return fmt.Errorf("netpol: read the informers: %w", err)
		}
		d := Decide(in)
		s := script(d)
		if s == applied && !force {
			g.release(seq, in)
			continue
		}
		t := time.Now()
		tx := nft.NewTransaction()
		fill(tx, d)
		if err := nft.Run(ctx, tx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			retry = min(max(2*retry, 250*time.Millisecond), 30*time.Second)
			log.Printf("netpol: writing the rules failed (again in %v): %v", retry, err)
			applied = ""
			continue
		}
		retry = 0
		g.release(seq, in)
		if s != applied {
			ing, eg := 0, 0
			for _, p := range d.Pods {
				if p.Ingress != nil {
					ing++
				}
				if p.Egress != nil {
					eg++
				}
			}
			log.Printf("netpol: rules written in %v: %d pods isolated for ingress, %d for egress, from %d policies",
				time.Since(t).Round(time.Millisecond), ing, eg, len(in.Policies))
		}
		applied = s
	}
}

// NewCommand is `socialweb kube netpol`.
func NewCommand() *cobra.Command {
	var o Options
	cmd := &cobra.Command{
		Use:   "netpol --kubeconfig FILE --node-name NAME",
		Short: "Enforce NetworkPolicy for the pods of one node (nftables, in the node's network namespace)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			return Run(ctx, o)
		},
	}
	cmd.Flags().StringVar(&o.Kubeconfig, "kubeconfig", "", "the node's kubeconfig")
	cmd.Flags().StringVar(&o.NodeName, "node-name", "", "the node's name")
	cmd.Flags().DurationVar(&o.MinInterval, "min-interval", 200*time.Millisecond, "the least time between two rewrites of the rules")
	cmd.Flags().DurationVar(&o.Resync, "resync", time.Minute, "rewrite the rules this often even without a change")
	cmd.Flags().StringVar(&o.GateSocket, "gate-socket", "", "serve the node's CNI plugin "+podgate.PluginName+" on this unix socket: a new pod starts once the rules know its addresses")
	return cmd
}

// podForDecision keeps of a pod what Decide reads: its name, namespace and labels, node,
// host networking, container ports, phase and addresses.
func podForDecision(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone
	}
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, Labels: p.Labels,
			ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}
	for _, c := range p.Spec.Containers {
		if len(c.Ports) > 0 {
			out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Name: c.Name, Ports: c.Ports})
		}
	}
	return out, nil
}
