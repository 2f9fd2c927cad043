package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/scale"
	"socialweb.computer/internal/testenv"
)

// Consolidation by replacement: up's node bidder prices a node at 100 + 10 per CPU an hour.
// Two pods of 600m kept apart by anti-affinity, one after the other, rent two 1-CPU nodes
// (110 each); once the anti-affinity is dropped, neither node holds the other's pod, so no
// node can simply be drained, but both pods fit one 2-CPU node, which the market sells for 120, less than the
// 220 the two cost. After scaleHold the node host rents that node capped at 219, and once it
// is Ready drains the two (the PDB lets one pod go at a time) and releases them: both pods
// run on the one new node, and nothing more is rented.
func TestScale_TwoNodesAreReplacedByOneCheaper(t *testing.T) {
	t.Parallel()
	n := startNodeUp(t, "--node-cost", "100", "--node-cost-per-cpu", "10", "--node-currency", "USD")
	kc, replaced := twoOneCPUNodes(t, n, "repl", 110)

	t0 := time.Now()
	tkubectl(t, kc, "", "patch", "deployment", "web", "--type=json", "-p", `[{"op":"remove","path":"/spec/template/spec/affinity"}]`)
	tkubectl(t, kc, "", "rollout", "status", "deployment/web", "--timeout=120s")

	var msgs []string
	scaling := func() {
		var cl v1alpha1.Cluster
		if err := n.c.Get(n.ctx, client.ObjectKey{Namespace: "default", Name: "repl"}, &cl); err == nil {
			if c := meta.FindStatusCondition(cl.Status.Conditions, string(v1alpha1.ConditionScaling)); c != nil &&
				(len(msgs) == 0 || msgs[len(msgs)-1] != c.Message) {
				msgs = append(msgs, c.Message)
			}
		}
	}
	var last map[string]v1alpha1.NodeClaim
	testenv.Eventually(t, 240*time.Second, "one new claim left and both pods Running on its node", func() (bool, error) {
		scaling()
		last = n.claims("repl")
		if len(last) != 1 {
			return false, fmt.Errorf("%d claims; Scaling: %q", len(last), msgs[max(len(msgs)-1, 0):])
		}
		for name := range last {
			if slices.Contains(replaced, name) {
				return false, fmt.Errorf("the claim left is of %s, one of the replaced nodes", name)
			}
		}
		return webPodsRunOn(kc, last)
	})
	t.Logf("replaced %v by one node in %.2fs after the rollout", replaced, time.Since(t0).Seconds())
	for name, c := range last {
		if !slices.Equal(c.Spec.Replaces, replaced) {
			t.Errorf("claim of %s replaces %v, want %v", name, c.Spec.Replaces, replaced)
		}
		if p := c.Spec.MaxPrice; p == nil || p.Cost != 219 || p.Currency != "USD" {
			t.Errorf("claim of %s capped at %+v, want 219 USD (what the two cost, less one)", name, p)
		}
		if p := c.Status.Price; p == nil || p.Cost != 120 || p.Currency != "USD" {
			t.Errorf("claim of %s costs %+v, want 120 USD (a 2-CPU node)", name, p)
		}
		if c.Spec.CPUs != 2 {
			t.Errorf("claim of %s rents %d CPUs, want 2 for both pods", name, c.Spec.CPUs)
		}
	}
	said := false
	for _, m := range msgs {
		// The decision to rent is followed at once by the wait for the node; a poll sees
		// one or the other.
		said = said || strings.Contains(m, "to replace "+strings.Join(replaced, ", ")+", at most 219 USD an hour") ||
			strings.Contains(m, scale.ReasonReplacing)
	}
	if !said {
		t.Errorf("the Scaling condition never said what the new node replaces and its cap: %q", msgs)
	}
	time.Sleep(5 * time.Second)
	if cs := n.claims("repl"); len(cs) != 1 {
		t.Errorf("%d claims after the replacement, want 1\n%s", len(cs), n.dump())
	}
}

// Without a saving there is no replacement: up's node bidder prices 100 per CPU and nothing
// per node, so one 2-CPU node costs what two 1-CPU nodes do (200). The node host offers the
// replacement to the market capped at 199; the requester refuses the only bid (200 is over
// the cap), the claim fails and goes, and the two nodes stay rented with both pods Running
// on them. The same nodes are not offered again within the retry.
func TestScale_NoReplacementWithoutASaving(t *testing.T) {
	t.Parallel()
	n := startNodeUp(t, "--node-cost-per-cpu", "100", "--node-currency", "USD")
	kc, replaced := twoOneCPUNodes(t, n, "flat", 100)
	tkubectl(t, kc, "", "patch", "deployment", "web", "--type=json", "-p", `[{"op":"remove","path":"/spec/template/spec/affinity"}]`)
	tkubectl(t, kc, "", "rollout", "status", "deployment/web", "--timeout=120s")

	// The replacement is tried: a claim capped at 199 that fails with its bid refused.
	var tried v1alpha1.NodeClaim
	testenv.Eventually(t, 120*time.Second, "a replacement claim capped at 199 USD, Failed for its bid over the cap", func() (bool, error) {
		for name, c := range n.claims("flat") {
			if slices.Contains(replaced, name) {
				continue
			}
			if p := c.Spec.MaxPrice; p == nil || p.Cost != 199 || p.Currency != "USD" || !slices.Equal(c.Spec.Replaces, replaced) {
				return false, fmt.Errorf("claim of %s: maxPrice %+v, replaces %v", name, p, c.Spec.Replaces)
			}
			tried = c
			return c.Status.Phase == v1alpha1.NodeClaimFailed, fmt.Errorf("replacement %s: %s: %s", c.Name, c.Status.Phase, c.Status.Message)
		}
		return false, fmt.Errorf("no replacement claim yet")
	})
	t.Logf("replacement refused: %s", tried.Status.Message)
	if !strings.Contains(tried.Status.Message, "maxCost") {
		t.Errorf("the failed replacement does not say its bid was over the cap: %q", tried.Status.Message)
	}
	// It goes, the two nodes stay with their pods, and nothing is tried again for now.
	testenv.Eventually(t, 60*time.Second, "the failed replacement gone, the two nodes left", func() (bool, error) {
		cs := n.claims("flat")
		return len(cs) == 2, fmt.Errorf("%d claims", len(cs))
	})
	time.Sleep(10 * time.Second)
	cs := n.claims("flat")
	var names []string
	for name := range cs {
		names = append(names, name)
	}
	slices.Sort(names)
	if !slices.Equal(names, replaced) {
		t.Fatalf("claims of %v after the refused replacement, want %v\n%s", names, replaced, n.dump())
	}
	if ok, err := webPodsRunOn(kc, cs); !ok {
		t.Errorf("pods after the refused replacement: %v", err)
	}
	var cl v1alpha1.Cluster
	if err := n.c.Get(n.ctx, client.ObjectKey{Namespace: "default", Name: "flat"}, &cl); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(cl.Status.Conditions, string(v1alpha1.ConditionScaling)); c == nil || !strings.Contains(c.Message, scale.ReasonReplaceTried) {
		t.Errorf("Scaling after the refused replacement: %+v, want %q", c, scale.ReasonReplaceTried)
	}
}

// twoOneCPUNodes rents a Cluster two 1-CPU nodes, one 600m web pod on each (kept apart by
// anti-affinity), each priced price by its winning bid, and returns the tenant's kubeconfig
// and the two nodes' names, sorted. The pods come one after the other, so each node is
// rented alone at the smallest size that holds its pod (two bought at once would each get
// room for a pod more, and be 2-CPU nodes).
func twoOneCPUNodes(t *testing.T, n *nodeUp, cluster string, price int64) (string, []string) {
	t.Helper()
	kc := n.cluster(cluster, `maxNodes: 3, podsPerNode: 10, scaleHold: 10s, consolidationPolicy: WhenUnderutilized, disruptionBudget: "2"`)
	web := strings.Replace(strings.Replace(webDeployment(), "cpu: 300m", "cpu: 600m", 1), "replicas: 2", "replicas: 1", 1)
	tkubectl(t, kc, web, "apply", "-f", "-")
	n.waitClaimsRunning(cluster, 1, 240*time.Second)
	rollout := func() {
		if out, err := tkubectlErr(kc, "rollout", "status", "deployment/web", "--timeout=120s"); err != nil {
			pods, _ := tkubectlErr(kc, "get", "pods,nodes,events", "-o", "wide")
			t.Fatalf("rollout: %v\n%s\n%s\n%s", err, out, pods, n.dump())
		}
	}
	rollout()
	tkubectl(t, kc, "", "scale", "deployment/web", "--replicas=2")
	first := n.waitClaimsRunning(cluster, 2, 240*time.Second)
	rollout()
	var names []string
	for name, c := range first {
		names = append(names, name)
		if c.Spec.CPUs != 1 {
			t.Errorf("claim %s rents %d CPUs, want 1 for one 600m pod", c.Name, c.Spec.CPUs)
		}
	}
	slices.Sort(names)
	testenv.Eventually(t, 30*time.Second, "both claims priced by their winning bid", func() (bool, error) {
		for name, c := range n.claims(cluster) {
			if p := c.Status.Price; p == nil || p.Cost != price || p.Currency != "USD" {
				return false, fmt.Errorf("claim of %s: price %+v, want %d USD", name, p, price)
			}
		}
		return true, nil
	})
	return kc, names
}
