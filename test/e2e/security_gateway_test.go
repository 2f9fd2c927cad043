package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/gateway"
	"socialweb.computer/internal/pds/plc"
	"socialweb.computer/internal/testenv"
)

// plcCaller is an identity made only by posting a genesis operation to a PLC directory: no
// account on any PDS; it signs its own service-auth tokens with its own key.
type plcCaller struct {
	t   *testing.T
	did string
	key *atcrypto.PrivateKeyK256
	gw  string
	aud string
}

func newPLCCaller(t *testing.T, plcURL, gwURL, aud string) *plcCaller {
	t.Helper()
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := key.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	did, op, err := plc.Genesis(key, []string{pub.DIDKey()}, pub.DIDKey(), "stranger.invalid", "http://127.0.0.1:9")
	if err != nil {
		t.Fatal(err)
	}
	if err := (&plc.Client{URL: plcURL}).Submit(context.Background(), did, op); err != nil {
		t.Fatalf("posting the genesis operation: %v", err)
	}
	return &plcCaller{t: t, did: did, key: key, gw: gwURL, aud: aud}
}

// call calls nsid with a fresh token of its own; RateLimitExceeded is waited out, as
// gwCaller does.
func (c *plcCaller) call(nsid string, in, out any) error {
	c.t.Helper()
	lxm, _, _ := strings.Cut(nsid, "?")
	m := syntax.NSID(lxm)
	for {
		tok, err := auth.SignServiceAuth(syntax.DID(c.did), c.aud, time.Minute, &m, c.key)
		if err != nil {
			c.t.Fatal(err)
		}
		err = gateway.Call(context.Background(), c.gw, nsid, tok, in, out)
		var xe *gateway.Error
		if errors.As(err, &xe) && xe.Name == gateway.ErrRateLimitExceeded {
			time.Sleep(xe.RetryAfter)
			continue
		}
		return err
	}
}

// upGateway starts up with args and returns it with its gateway's URL and audience and its
// PLC directory's URL.
func upGateway(t *testing.T, args ...string) (up *upProc, dir, gwURL, aud, pdsURL, plcURL string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "data")
	up = startUp(t, dir, args...)
	gwURL, pdsURL = up.phase(t, "gateway serving at "), up.phase(t, "PDS serving at ")
	plcURL = strings.TrimRight(up.phase(t, "(PLC "), "),")
	aud, err := gateway.DIDForURL(gwURL)
	if err != nil {
		t.Fatal(err)
	}
	return up, dir, gwURL, aud, pdsURL, plcURL
}

// accountClusters lists the Clusters of did's namespace in up's core.
func accountClusters(t *testing.T, dir, did string) []string {
	t.Helper()
	var list v1alpha1.ClusterList
	if err := coreClient(t, dir).List(context.Background(), &list, client.InNamespace(gateway.AccountNamespace(did))); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range list.Items {
		names = append(names, c.Name)
	}
	return names
}

// A fresh up serves its own account only: a DID made by posting a genesis operation to up's
// PLC directory, signing its own token, is refused createCluster AccountNotAllowed (the
// message names the flag that admits it), and nothing is written in the core.
func TestSecurityGateway_PLCOnlyDIDRefusedByAllowList(t *testing.T) {
	_, dir, gwURL, aud, _, plcURL := upGateway(t)
	s := newPLCCaller(t, plcURL, gwURL, aud)
	err := s.call(cluster.CreateClusterNSID, map[string]string{"name": "taken"}, nil)
	var xe *gateway.Error
	if !errors.As(err, &xe) || xe.Name != gateway.ErrAccountNotAllowed || xe.Status != http.StatusForbidden ||
		!strings.Contains(xe.Message, "--gateway-allow "+s.did) {
		t.Fatalf("createCluster by a PLC-only DID: %v; want 403 AccountNotAllowed naming --gateway-allow %s", err, s.did)
	}
	for _, nsid := range []string{cluster.ListClustersNSID, cluster.GetKubeconfigNSID, cluster.KubectlApplyServerSideNSID} {
		var in any
		if nsid != cluster.ListClustersNSID {
			in = map[string]any{"name": "taken", "cluster": "taken", "manifest": json.RawMessage(`{}`)}
		}
		if got := errName(s.call(nsid, in, nil)); got != gateway.ErrAccountNotAllowed {
			t.Errorf("%s by a PLC-only DID: %q, want AccountNotAllowed", nsid, got)
		}
	}
	if got := accountClusters(t, dir, s.did); len(got) != 0 {
		t.Errorf("clusters of the refused DID in the core: %v", got)
	}
}

// (Its name and its cluster's are short: the tenant etcd's unix socket lives under the test's
// temporary directory, and a socket path is at most 108 bytes.)
//
// With --gateway-open the same kind of DID may create a cluster; then the attack of the
// issue: a privileged Job with hostPID, hostNetwork and a hostPath volume, applied through
// kubectlApplyServerSide. Pod Security (baseline, enforced by the tenant apiserver) must keep
// it from ever getting a pod: the apply is refused, or the Job's pods are refused
// ("violates PodSecurity"). The host marker the Job would write stays absent.
func TestSecurityGateway_OpenPodSecurity(t *testing.T) {
	requireTenantHost(t)
	_, dir, gwURL, aud, _, plcURL := upGateway(t, "--gateway-open")
	s := newPLCCaller(t, plcURL, gwURL, aud)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := kubectlRun(dir, "", "get", "clusters", "-A", "-o", "yaml")
			t.Logf("the Clusters:\n%s", out)
			if b, err := os.ReadFile(filepath.Join(dir, "logs", "socialweb.log")); err == nil {
				for _, l := range strings.Split(string(b), "\n") {
					if strings.Contains(l, "cluster") && (strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN")) {
						t.Log(l)
					}
				}
			}
		}
	})
	if err := s.call(cluster.CreateClusterNSID, map[string]string{"name": "o1"}, nil); err != nil {
		t.Fatalf("createCluster by a PLC-only DID on an open gateway: %v", err)
	}
	testenv.Eventually(t, 90*time.Second, "o1 Ready", func() (bool, error) {
		var out cluster.ListClustersOutput
		if err := s.call(cluster.ListClustersNSID, nil, &out); err != nil {
			return false, err
		}
		if len(out.Clusters) != 1 {
			return false, fmt.Errorf("%d clusters", len(out.Clusters))
		}
		return out.Clusters[0].Phase == "Ready", fmt.Errorf("phase %s", out.Clusters[0].Phase)
	})
	var kc cluster.GetKubeconfigOutput
	if err := s.call(cluster.GetKubeconfigNSID, map[string]any{"name": "o1", "ttlSeconds": 600}, &kc); err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc.Kubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}

	hostDir := t.TempDir() // outside the data dir: what the Jobs would write on the host
	marker := filepath.Join(hostDir, "escaped")
	// Two Jobs: the privileged one, and the same without privileged (hostPID,
	// hostNetwork and the hostPath volume alone), which only Pod Security refuses.
	for _, c := range []struct{ name, securityContext string }{
		{"escape", `,"securityContext":{"privileged":true}`},
		{"escape-host", ``},
	} {
		job := fmt.Sprintf(`{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":%q,"namespace":"default"},
			"spec":{"backoffLimit":0,"template":{"spec":{"restartPolicy":"Never","hostPID":true,"hostNetwork":true,
			"containers":[{"name":"c","image":"socialweb.computer/busybox:local","imagePullPolicy":"Never",
			"command":["sh","-c","echo escaped > /host/escaped"]%s,"volumeMounts":[{"name":"host","mountPath":"/host"}]}],
			"volumes":[{"name":"host","hostPath":{"path":%q}}]}}}}`, c.name, c.securityContext, hostDir)
		err = s.call(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "o1", "manifest": json.RawMessage(job)}, nil)
		switch {
		case err != nil && (strings.Contains(err.Error(), "PodSecurity") || strings.Contains(err.Error(), "disallowed by cluster policy")):
			// Refused at apply: Pod Security, or the apiserver's --allow-privileged=false.
			t.Logf("%s: the apply was refused: %v", c.name, err)
		case err != nil:
			t.Fatalf("kubectlApplyServerSide of Job %s: %v; want a Pod Security refusal or an admitted Job whose pods are refused", c.name, err)
		default:
			// Pod Security enforces on pods: a Job is admitted (with a warning) and the Job
			// controller's pod creations are refused. The Job must never get a pod.
			if ev := noPodEver(t, cs, c.name); ev == "" {
				t.Errorf("%s: no FailedCreate event saying the Job's pod violates PodSecurity within 45s", c.name)
			} else {
				t.Logf("%s: the Job's pod was refused: %s", c.name, ev)
			}
		}
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("the host marker %s exists (%v): a Job wrote on the host", marker, err)
	}
}

// noPodEver watches an admitted Job for 45 s: it fails the test at once if the Job gets a pod
// (deleting the Job before the pod runs anywhere) and returns the FailedCreate event that says
// its pod violates PodSecurity ("" if none came).
func noPodEver(t *testing.T, cs kubernetes.Interface, job string) string {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job})
		if err == nil && len(pods.Items) > 0 {
			bg := metav1.DeletePropagationBackground
			_ = cs.BatchV1().Jobs("default").Delete(ctx, job, metav1.DeleteOptions{PropagationPolicy: &bg})
			t.Fatalf("Job %s got pod %s: Pod Security did not refuse it", job, pods.Items[0].Name)
		}
		evs, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + job})
		if err != nil {
			continue
		}
		for _, e := range evs.Items {
			if e.Reason == "FailedCreate" && strings.Contains(e.Message, "violates PodSecurity") {
				return e.Message
			}
		}
	}
	return ""
}

// The clusters quota through up's gateway: with --quota-clusters 2 the account's third
// createCluster is refused QuotaExceeded naming the quota and the use, and no third Cluster
// is written; a deleted cluster makes room.
func TestSecurityGateway_ClusterQuota(t *testing.T) {
	up, dir, gwURL, aud, pdsURL, _ := upGateway(t, "--quota-clusters", "2")
	a, acct, _ := ownerCaller(t, up, pdsURL, gwURL, aud)
	for _, n := range []string{"q1", "q2"} {
		a.must(cluster.CreateClusterNSID, map[string]string{"name": n}, nil)
		// Stopped at once: the row is about the count, not about running control planes.
		a.must(cluster.ControlPlaneDownNSID, map[string]string{"name": n}, nil)
	}
	err := a.call(cluster.CreateClusterNSID, map[string]string{"name": "q3"}, nil)
	var xe *gateway.Error
	if !errors.As(err, &xe) || xe.Name != gateway.ErrQuotaExceeded || !strings.Contains(xe.Message, "quota clusters") ||
		!strings.Contains(xe.Message, "uses 2 of 2 clusters") {
		t.Fatalf("the third createCluster: %v; want QuotaExceeded naming quota clusters, 2 of 2", err)
	}
	if got := accountClusters(t, dir, acct.DID); len(got) != 2 {
		t.Errorf("clusters in the core after the refusal: %v", got)
	}
	a.must(cluster.DeleteClusterNSID, map[string]string{"name": "q2"}, nil)
	testenv.Eventually(t, 60*time.Second, "q2 gone", func() (bool, error) {
		return len(accountClusters(t, dir, acct.DID)) == 1, nil
	})
	a.must(cluster.CreateClusterNSID, map[string]string{"name": "q3"}, nil)
	a.must(cluster.ControlPlaneDownNSID, map[string]string{"name": "q3"}, nil)
}

// Rate limits with up's defaults: an account calling faster than its rate is refused 429
// RateLimitExceeded with a Retry-After, and so is an address flooding the gateway without
// any token (counted before the token is looked at).
func TestSecurityGateway_RateLimit(t *testing.T) {
	up, _, gwURL, aud, pdsURL, _ := upGateway(t)
	_, _, pa := ownerCaller(t, up, pdsURL, gwURL, aud)
	ctx := context.Background()
	const calls = 80 // past the per-account burst (40), within the per-address one (100)
	tokens := make([]string, calls)
	for i := range tokens {
		tok, err := pa.GetServiceAuth(ctx, aud, cluster.ListClustersNSID, 0)
		if err != nil {
			t.Fatal(err)
		}
		tokens[i] = tok
	}
	count := func(n int, token func(i int) string) (ok, limited int, retryAfter time.Duration) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := gateway.Call(ctx, gwURL, cluster.ListClustersNSID, token(i), nil, nil)
				var xe *gateway.Error
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					ok++
				case errors.As(err, &xe) && xe.Name == gateway.ErrRateLimitExceeded && xe.Status == http.StatusTooManyRequests:
					limited++
					retryAfter = xe.RetryAfter
				}
			}()
		}
		wg.Wait()
		return
	}
	ok, limited, retry := count(calls, func(i int) string { return tokens[i] })
	if limited == 0 || ok < 40 || retry <= 0 {
		t.Errorf("%d calls of one account at once: %d answered, %d refused RateLimitExceeded (Retry-After %s); want refusals past the burst of 40, with a Retry-After", calls, ok, limited, retry)
	}
	_, limited, _ = count(300, func(int) string { return "" })
	if limited == 0 {
		t.Errorf("300 calls without a token from one address at once: none refused RateLimitExceeded")
	}
}
