package e2e

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/gateway"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/testenv"
)

// gwCaller calls the gateway as one account, with a fresh service-auth token from its PDS
// for every call.
type gwCaller struct {
	t   *testing.T
	pds *atclient.Client
	gw  string
	aud string
}

// ownerCaller logs in as the local account up made (handle and DID from its
// pds/account.json, the password from the line up printed once when it made the account) and
// returns a gateway caller for it, the account and its PDS client.
func ownerCaller(t *testing.T, up *upProc, pdsURL, gwURL, aud string) (*gwCaller, app.LocalAccount, *atclient.Client) {
	t.Helper()
	acct := localAccount(t, up)
	pa := atclient.New(pdsURL)
	if _, err := pa.Login(context.Background(), acct.Handle, acct.Password); err != nil {
		t.Fatal(err)
	}
	return &gwCaller{t: t, pds: pa, gw: gwURL, aud: aud}, acct, pa
}

// localAccount is the account of up's pds/account.json with the password up printed for it.
func localAccount(t *testing.T, up *upProc) app.LocalAccount {
	t.Helper()
	var acct app.LocalAccount
	b, err := os.ReadFile(filepath.Join(up.dir, "pds", "account.json"))
	if err != nil || json.Unmarshal(b, &acct) != nil || acct.DID == "" {
		t.Fatalf("account.json: %v %s", err, b)
	}
	acct.Password = up.phase(t, "password of "+acct.Handle+": ")
	return acct
}

// call calls nsid with a fresh token; a call refused RateLimitExceeded (a row polling
// in a tight loop) is made again after the Retry-After, as a client should.
func (c *gwCaller) call(nsid string, in, out any) error {
	c.t.Helper()
	lxm, _, _ := strings.Cut(nsid, "?") // a query's parameters follow its NSID
	for {
		tok, err := c.pds.GetServiceAuth(context.Background(), c.aud, lxm, 0)
		if err != nil {
			c.t.Fatalf("getServiceAuth %s: %v", nsid, err)
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

func (c *gwCaller) must(nsid string, in, out any) {
	c.t.Helper()
	if err := c.call(nsid, in, out); err != nil {
		c.t.Fatalf("%s: %v", nsid, err)
	}
}

func (c *gwCaller) list() map[string]cluster.ListClustersClusterView {
	c.t.Helper()
	var out cluster.ListClustersOutput
	c.must(cluster.ListClustersNSID, nil, &out)
	m := map[string]cluster.ListClustersClusterView{}
	for _, v := range out.Clusters {
		m[v.Name] = v
	}
	return m
}

func (c *gwCaller) waitPhase(name, phase string, timeout time.Duration) cluster.ListClustersClusterView {
	c.t.Helper()
	var got cluster.ListClustersClusterView
	testenv.Eventually(c.t, timeout, "listClusters "+name+" "+phase, func() (bool, error) {
		v, ok := c.list()[name]
		got = v
		return ok && v.Phase == phase, errors.New(v.Phase)
	})
	return got
}

func errName(err error) string {
	var xe *gateway.Error
	if errors.As(err, &xe) {
		return xe.Name
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

// A tenant cluster's whole life through the gateway's XRPC methods, as two accounts of the
// PDS `up` runs: create, list, a kubeconfig used with client-go, down, up, the owner's own
// identity revoked, delete; the other account sees none of it.
func TestGateway_ClusterLifecycleOverXRPC(t *testing.T) {
	t.Parallel()
	requireTenantHost(t)
	dir := filepath.Join(t.TempDir(), "data")
	// Open sign-up (up's PDS is on loopback) for the second account below, and an open
	// gateway: that account is admitted, so what it may reach is the question here (who may
	// call at all is security_gateway_test.go's).
	up := startUp(t, dir, "--pds-open-signup", "--gateway-open")
	gwURL, pdsURL := up.phase(t, "gateway serving at "), up.phase(t, "PDS serving at ")
	if !strings.HasPrefix(gwURL, "http://127.0.0.1:") {
		t.Fatalf("gateway URL %q", gwURL)
	}
	aud, err := gateway.DIDForURL(gwURL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, acct, pa := ownerCaller(t, up, pdsURL, gwURL, aud)
	pb := atclient.New(pdsURL)
	if _, err := pb.CreateAccount(ctx, "olive.test", "other-password", ""); err != nil {
		t.Fatal(err)
	}
	other := &gwCaller{t: t, pds: pb, gw: gwURL, aud: aud}

	// A subscription opened before the cluster exists sees it appear and become Ready.
	subTok, err := pa.GetServiceAuth(ctx, aud, cluster.SubscribeClustersNSID, 0)
	if err != nil {
		t.Fatal(err)
	}
	ws, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(gwURL, "http")+"/xrpc/"+cluster.SubscribeClustersNSID+"?name=g1",
		http.Header{"Authorization": {"Bearer " + subTok}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	phases := make(chan string, 100)
	go func() {
		defer close(phases)
		for {
			_, b, err := ws.ReadMessage()
			if err != nil {
				return
			}
			var f struct{ Name, Phase string }
			if json.Unmarshal(b, &f) == nil {
				phases <- f.Name + " " + f.Phase
			}
		}
	}()

	var created cluster.CreateClusterOutput
	t0 := time.Now()
	a.must(cluster.CreateClusterNSID, map[string]string{"name": "g1"}, &created)
	if created.Phase != "Initializing" {
		t.Errorf("createCluster phase %q", created.Phase)
	}
	v := a.waitPhase("g1", "Ready", 90*time.Second)
	t.Logf("createCluster -> Ready in %.2fs", time.Since(t0).Seconds())
	if v.Running == nil || !*v.Running || v.Server == nil || !strings.HasPrefix(*v.Server, "https://127.0.0.1:") || v.Instance == nil ||
		v.TeardownBlocked == nil || *v.TeardownBlocked {
		t.Errorf("listClusters view %+v", v)
	}
	var seen []string
	timeout := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case p, ok := <-phases:
			seen = append(seen, p)
			done = !ok || p == "g1 Ready"
		case <-timeout:
			done = true
		}
	}
	if len(seen) < 3 || seen[0] != "SnapshotComplete " || seen[1] != "g1 Initializing" || seen[len(seen)-1] != "g1 Ready" {
		t.Errorf("subscribeClusters frames %q: want SnapshotComplete, g1 Initializing, ..., g1 Ready", seen)
	}
	if l := other.list(); len(l) != 0 {
		t.Errorf("the other account lists %v", l)
	}

	var kc cluster.GetKubeconfigOutput
	a.must(cluster.GetKubeconfigNSID, map[string]any{"name": "g1", "ttlSeconds": 600}, &kc)
	if kc.Instance == nil || *kc.Instance != *v.Instance {
		t.Errorf("getKubeconfig instance %v, want %s", kc.Instance, *v.Instance)
	}
	cfg, err := clientcmd.Load([]byte(kc.Kubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		if ai.Token != "" || ai.Exec != nil || len(ai.ClientCertificateData) == 0 {
			t.Errorf("kubeconfig credentials: token %v, exec %v, cert %d bytes", ai.Token != "", ai.Exec != nil, len(ai.ClientCertificateData))
		}
		blk, _ := pem.Decode(ai.ClientCertificateData)
		crt, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if left := time.Until(crt.NotAfter); crt.Subject.CommonName != acct.DID || left > 10*time.Minute || left < 9*time.Minute {
			t.Errorf("client certificate CN %q, %s left; want the DID, 10 min", crt.Subject.CommonName, left)
		}
	}
	listNamespaces := func() ([]string, error) {
		rc, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc.Kubeconfig))
		if err != nil {
			return nil, err
		}
		rc.Timeout = 5 * time.Second
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, err
		}
		l, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		var names []string
		for _, n := range l.Items {
			names = append(names, n.Name)
		}
		return names, nil
	}
	ns, err := listNamespaces()
	if err != nil {
		t.Fatalf("listing namespaces with the minted kubeconfig: %v", err)
	}
	for _, want := range tenant.DefaultNamespaces {
		if !strings.Contains(" "+strings.Join(ns, " ")+" ", " "+want+" ") {
			t.Errorf("namespaces %v lack %s", ns, want)
		}
	}
	// The other account naming g1 reaches nothing.
	for _, nsid := range []string{cluster.GetKubeconfigNSID, cluster.ControlPlaneDownNSID, cluster.DeleteClusterNSID} {
		if got := errName(other.call(nsid, map[string]string{"name": "g1"}, nil)); got != gateway.ErrClusterNotFound {
			t.Errorf("other account %s g1: %q, want ClusterNotFound", nsid, got)
		}
	}

	// computer.socialweb.k8s: applies as the owner's ServiceAccount, and a Job read back.
	rc, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc.Kubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	job := json.RawMessage(`{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"hello"},
		"spec":{"template":{"spec":{"restartPolicy":"Never","containers":[{"name":"c","image":"registry.invalid/busybox:1","command":["echo","hi"]}]}}}}`)
	var applied cluster.KubectlApplyServerSideOutput
	a.must(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "g1", "manifest": job, "dryRun": true}, &applied)
	if applied.Kind != "Job" || applied.Name != "hello" {
		t.Errorf("dry run: %+v", applied)
	}
	if _, err := cs.BatchV1().Jobs("default").Get(ctx, "hello", metav1.GetOptions{}); err == nil {
		t.Error("a dry run created the Job")
	}
	a.must(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "g1", "manifest": job}, &applied)
	if applied.APIVersion != "batch/v1" || applied.Kind != "Job" || applied.UID == nil || applied.Generation == nil || len(applied.Object) == 0 {
		t.Errorf("apply: %+v", applied)
	}
	stored, err := cs.BatchV1().Jobs("default").Get(ctx, "hello", metav1.GetOptions{})
	if err != nil || string(stored.UID) != *applied.UID || stored.ManagedFields[0].Manager != "socialweb-computer" ||
		stored.ManagedFields[0].Operation != metav1.ManagedFieldsOperationApply {
		t.Errorf("the applied Job as stored: %v %+v", err, stored)
	}
	cm := func(v string) json.RawMessage {
		return json.RawMessage(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"owned","namespace":"default"},"data":{"a":"` + v + `"}}`)
	}
	a.must(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "g1", "manifest": cm("1"), "fieldManager": "first"}, nil)
	if got := errName(a.call(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "g1", "manifest": cm("2"), "fieldManager": "second"}, nil)); got != gateway.ErrApplyConflict {
		t.Errorf("a conflicting apply: %q, want ApplyConflict", got)
	}
	a.must(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "g1", "manifest": cm("2"), "fieldManager": "second", "force": true}, nil)
	if got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "owned", metav1.GetOptions{}); err != nil || got.Data["a"] != "2" {
		t.Errorf("after a forced apply: %v %v", err, got.Data)
	}
	if got := errName(a.call(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "g1",
		"manifest": json.RawMessage(`{"apiVersion":"example.invalid/v1","kind":"Nothing","metadata":{"name":"x"}}`)}, nil)); got != gateway.ErrInvalidRequest {
		t.Errorf("an unknown kind: %q, want InvalidRequest", got)
	}
	var jobOut cluster.GetJobOutput
	testenv.Eventually(t, 30*time.Second, "getJob lists the Job's pod", func() (bool, error) {
		a.must(cluster.GetJobNSID+"?cluster=g1&namespace=default&name=hello&tailLines=10", nil, &jobOut)
		return len(jobOut.Pods) == 1, nil
	})
	if jobOut.Phase != "Pending" || jobOut.Counts == nil || len(jobOut.Pods[0].Containers) != 1 || jobOut.Pods[0].Containers[0].Name != "c" ||
		jobOut.Pods[0].Phase == nil || *jobOut.Pods[0].Phase != "Pending" {
		t.Errorf("getJob of a Job on a cluster without nodes: %+v", jobOut)
	}
	if got := errName(a.call(cluster.GetJobNSID+"?cluster=g1&namespace=default&name=absent", nil, nil)); got != gateway.ErrJobNotFound {
		t.Errorf("getJob of a missing Job: %q", got)
	}
	for _, c := range []struct {
		nsid string
		in   any
	}{
		{cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "g1", "manifest": cm("3"), "force": true}},
		{cluster.GetJobNSID + "?cluster=g1&namespace=default&name=hello", nil},
	} {
		if got := errName(other.call(c.nsid, c.in, nil)); got != gateway.ErrClusterNotFound {
			t.Errorf("other account %s: %q, want ClusterNotFound", c.nsid, got)
		}
	}

	var out cluster.ControlPlaneDownOutput
	a.must(cluster.ControlPlaneDownNSID, map[string]string{"name": "g1"}, &out)
	if out.Phase != "Unavailable" {
		t.Errorf("controlPlaneDown phase %q", out.Phase)
	}
	v = a.waitPhase("g1", "Unavailable", 60*time.Second)
	if v.Running == nil || *v.Running {
		t.Errorf("after controlPlaneDown running %v", v.Running)
	}
	if _, err := listNamespaces(); err == nil {
		t.Error("a stopped cluster still answers")
	}

	t1 := time.Now()
	var upOut cluster.ControlPlaneUpOutput
	a.must(cluster.ControlPlaneUpNSID, map[string]string{"name": "g1"}, &upOut)
	if upOut.Phase != "Initializing" {
		t.Errorf("controlPlaneUp phase %q", upOut.Phase)
	}
	a.waitPhase("g1", "Ready", 90*time.Second)
	t.Logf("controlPlaneUp -> Ready in %.2fs", time.Since(t1).Seconds())
	if _, err := listNamespaces(); err != nil {
		t.Errorf("the same kubeconfig after controlPlaneUp: %v", err)
	}

	// revokeIdentity of the owner's own DID: the deny record first (the gateway refuses it
	// every method that acts in g1), then its ServiceAccount and bindings leave the cluster,
	// so the kubeconfig minted before is refused by the tenant apiserver; a restart does not
	// give them back.
	var rev cluster.RevokeIdentityOutput
	a.must(cluster.RevokeIdentityNSID, map[string]string{"name": "g1", "did": acct.DID}, &rev)
	if len(rev.Revoked) != 1 || rev.Revoked[0].State != "Revoked" || rev.Revoked[0].Name != "serviceaccount/"+tenant.OwnerNamespace+"/"+tenant.OwnerServiceAccount(acct.DID) {
		t.Errorf("revokeIdentity: %+v", rev)
	}
	for _, c := range []struct {
		nsid string
		in   any
	}{
		{cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "g1", "manifest": cm("revoked"), "force": true}},
		{cluster.GetJobNSID + "?cluster=g1&namespace=default&name=hello", nil},
		{cluster.GetKubeconfigNSID, map[string]any{"name": "g1"}},
	} {
		if got := errName(a.call(c.nsid, c.in, nil)); got != gateway.ErrForbidden {
			t.Errorf("a revoked identity's %s: %q, want Forbidden", c.nsid, got)
		}
	}
	forbidden := func() bool {
		_, err := listNamespaces()
		return apierrors.IsForbidden(err)
	}
	testenv.Eventually(t, 10*time.Second, "the revoked DID's kubeconfig is refused", func() (bool, error) { return forbidden(), nil })
	a.must(cluster.ControlPlaneDownNSID, map[string]string{"name": "g1"}, nil)
	a.waitPhase("g1", "Unavailable", 60*time.Second)
	a.must(cluster.ControlPlaneUpNSID, map[string]string{"name": "g1"}, nil)
	a.waitPhase("g1", "Ready", 90*time.Second)
	if !forbidden() {
		t.Errorf("the revoked DID's kubeconfig answers again after a restart")
	}

	t2 := time.Now()
	var del cluster.DeleteClusterOutput
	a.must(cluster.DeleteClusterNSID, map[string]string{"name": "g1"}, &del)
	if took := time.Since(t2); del.Phase != "Draining" || took > 5*time.Second {
		t.Errorf("deleteCluster: phase %q after %s; want Draining at once", del.Phase, took)
	}
	testenv.Eventually(t, 60*time.Second, "g1 gone from listClusters", func() (bool, error) {
		_, ok := a.list()["g1"]
		return !ok, nil
	})
	if left := controlPlanesRunning(dir); len(left) != 0 {
		t.Errorf("control planes left: %v", left)
	}
	if _, err := os.Stat(filepath.Join(dir, "tenants", gateway.AccountNamespace(acct.DID), "g1")); !os.IsNotExist(err) {
		t.Errorf("cluster directory left after deleteCluster: %v", err)
	}
	if got := errName(a.call(cluster.ControlPlaneUpNSID, map[string]string{"name": "g1"}, nil)); got != gateway.ErrClusterNotFound {
		t.Errorf("controlPlaneUp of a deleted cluster: %q", got)
	}
	// The node its Job rented is released too: no guest process of up's node bidder is left.
	testenv.Eventually(t, 120*time.Second, "g1's node released", func() (bool, error) {
		left := substratetest.Procs(filepath.Join(dir, "node-bidder", "guests"))
		return len(left) == 0, fmt.Errorf("guest processes %v", left)
	})
}

// `socialweb serve gateway` next to a running up: its own URL and DID, tokens from up's PDS,
// Clusters written into up's core.
func TestCLI_ServeGateway(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir)
	pdsURL := up.phase(t, "PDS serving at ")
	plcURL := strings.TrimRight(up.phase(t, "(PLC "), "),")
	cmd := exec.Command(socialwebBin, "serve", "gateway", "--data-dir", dir, "--plc-url", plcURL)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	lines := make(chan string, 10)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	})
	var line string
	select {
	case line = <-lines:
	case err := <-done:
		t.Fatalf("serve gateway exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve gateway printed nothing in 30s")
	}
	var gwURL, did string
	if _, err := fmt.Sscanf(line, "gateway serving at %s (service DID %s", &gwURL, &did); err != nil || !strings.HasPrefix(gwURL, "http://127.0.0.1:") {
		t.Fatalf("serve gateway printed %q (%v)", line, err)
	}
	did = strings.TrimRight(did, ",")
	if want, _ := gateway.DIDForURL(gwURL); did != want {
		t.Errorf("service DID %q, want %q", did, want)
	}
	a, acct, _ := ownerCaller(t, up, pdsURL, gwURL, did)
	a.must(cluster.CreateClusterNSID, map[string]string{"name": "s1"}, nil)
	if _, ok := a.list()["s1"]; !ok {
		t.Error("listClusters lacks the cluster just created")
	}
	out := up.kubectl(t, "", "get", "clusters", "-n", gateway.AccountNamespace(acct.DID), "-o", "jsonpath={.items[*].spec.account}/{.items[*].spec.name}")
	if out != acct.DID+"/s1" {
		t.Errorf("Cluster in up's core: %q", out)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve gateway after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Error("serve gateway did not stop within 15s of SIGTERM")
	}
}
