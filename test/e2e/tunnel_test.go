package e2e

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/certs"
	"socialweb.computer/internal/testenv"
)

// The tenant apiserver reaches into its cluster only through its nodes' tunnels: an
// admission webhook served by a pod behind a Service works, and so do the pod and Service
// proxy; a webhook URL or a pod address the owner points at the provider's host reaches
// nothing there (before the tunnels, the apiserver dialled both from the host).
func TestTunnel_ApiserverReachesItsClusterOnly(t *testing.T) {
	t.Parallel()
	const nodeName = "node-t"
	tc := joinableCluster(t, "tun1", nodeName, 10*time.Minute)
	writeProbeImage(t, tc.images)
	// Anything on the provider's host a tenant would like its apiserver to reach: a listener
	// on the tenant apiservers' advertise address (up's swt0).
	hostAddr, hits := countingListener(t, "10.77.0.1:0")
	_, port, _ := net.SplitHostPort(hostAddr)
	dump := readyNode(t, tc, "tun1-a", nodeName, nodeOptions{DNSUpstream: "none", Logs: []string{"log", "kubelet.log", "kube-proxy.log"}}).Dump
	kc := tc.kc

	// The webhook's serving certificate, for its Service's name, from a CA of the test's.
	ca, caKey, err := certs.NewCA("probe-webhook-ca")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := certs.Issue(ca, caKey, certs.Leaf{Subject: pkix.Name{CommonName: "webhook.default.svc"}, Usage: x509.ExtKeyUsageServerAuth, DNSNames: []string{"webhook.default.svc"}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := certs.KeyPEM(key)
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	tkubectl(t, kc, `apiVersion: v1
kind: Secret
metadata: {name: webhook-tls, namespace: default}
type: kubernetes.io/tls
data: {tls.crt: `+b64(certs.CertPEM(crt.Raw))+`, tls.key: `+b64(keyPEM)+`}
---
apiVersion: v1
kind: Pod
metadata: {name: webhook, namespace: default, labels: {app: webhook}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: `+probeImage+`
    imagePullPolicy: Never
    args: [webhook, "8443", /tls/tls.crt, /tls/tls.key]
    env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
    volumeMounts: [{name: tls, mountPath: /tls}]
  volumes: [{name: tls, secret: {secretName: webhook-tls}}]
---
`+probeServer("server-0")+`---
apiVersion: v1
kind: Service
metadata: {name: webhook, namespace: default}
spec:
  selector: {app: webhook}
  ports: [{port: 443, targetPort: 8443}]
---
apiVersion: v1
kind: Service
metadata: {name: probe, namespace: default}
spec:
  selector: {app: probe}
  ports: [{name: http, port: 80, targetPort: 8080}]
`, "apply", "-f", "-")
	testenv.Eventually(t, 90*time.Second, "pods Running", func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "pods", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}`)
		return out == "server-0=Running webhook=Running ", fmt.Errorf("%q\n%s", out, dump())
	})

	// The pod and Service proxy.
	testenv.Eventually(t, 30*time.Second, "the pod proxy", func() (bool, error) {
		out, err := tkubectlErr(kc, "get", "--raw", "/api/v1/namespaces/default/pods/server-0:8080/proxy/")
		return out == "server-0", fmt.Errorf("%q %v\n%s", out, err, dump())
	})
	testenv.Eventually(t, 30*time.Second, "the Service proxy", func() (bool, error) {
		out, err := tkubectlErr(kc, "get", "--raw", "/api/v1/namespaces/default/services/probe:http/proxy/")
		return out == "server-0", fmt.Errorf("%q %v", out, err)
	})
	// Logs and exec go to the kubelet through the tunnel as well.
	if out, err := tkubectlErr(kc, "exec", "server-0", "--", "/svcprobe", "get", "http://127.0.0.1:8080/"); err != nil || strings.TrimSpace(out) != "200 server-0" {
		t.Fatalf("exec: %q %v", out, err)
	}

	// The kubelet's API through the tunnel: its system log and profiling handlers are off.
	for _, path := range []string{"logs/", "debug/pprof/"} {
		if out, err := tkubectlErr(kc, "get", "--raw", "/api/v1/nodes/"+nodeName+"/proxy/"+path); err == nil {
			t.Errorf("the kubelet serves /%s to the owner: %q", path, firstLine(out))
		}
	}
	if out, err := tkubectlErr(kc, "get", "--raw", "/api/v1/nodes/"+nodeName+"/proxy/healthz"); err != nil || out != "ok" {
		t.Errorf("the kubelet's /healthz through the tunnel: %q %v", out, err)
	}

	// An admission webhook behind a Service, called by the apiserver.
	tkubectl(t, kc, `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: probe}
webhooks:
- name: probe.webhook.test
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 10
  objectSelector: {matchLabels: {probe-webhook: "on"}}
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}]
  clientConfig:
    caBundle: `+b64(certs.CertPEM(ca.Raw))+`
    service: {name: webhook, namespace: default, port: 443}
`, "apply", "-f", "-")
	create := func(name, label string) (string, error) {
		return tkubectlIn(kc, `apiVersion: v1
kind: ConfigMap
metadata: {name: `+name+`, namespace: default, labels: {`+label+`: "on"}}
`, "create", "-f", "-")
	}
	testenv.Eventually(t, 30*time.Second, "the webhook denies", func() (bool, error) {
		out, err := create("denied-1", "probe-webhook")
		return err != nil && strings.Contains(err.Error(), "denied by the probe webhook in pod webhook"), fmt.Errorf("%q %v\n%s", out, err, dump())
	})
	t0 := time.Now()
	const n = 10
	for i := 0; i < n; i++ {
		if out, err := create(fmt.Sprintf("allowed-%d", i), "probe-webhook"); err != nil {
			t.Fatalf("the webhook refused an allowed ConfigMap: %q %v", out, err)
		}
	}
	t.Logf("a create through the webhook, via the tunnel: %.0f ms (kubectl included), n=%d", time.Since(t0).Seconds()*1000/n, n)

	// Attack 1: a webhook whose URL is the provider's host. failurePolicy Ignore, so the
	// create goes on whatever the call did; the host must see no connection.
	tkubectl(t, kc, `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: to-the-host}
webhooks:
- name: host.webhook.test
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Ignore
  timeoutSeconds: 5
  objectSelector: {matchLabels: {to-host: "on"}}
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}]
  clientConfig: {url: "https://10.77.0.1:`+port+`/"}
`, "apply", "-f", "-")
	time.Sleep(time.Second) // the webhook configuration's informer
	for i := 0; i < 3; i++ {
		if out, err := create(fmt.Sprintf("host-%d", i), "to-host"); err != nil {
			t.Fatalf("create with an ignored failing webhook: %q %v", out, err)
		}
	}

	// Attack 2: a pod whose status the owner writes with the host's address, then the pod
	// proxy to it. The pod is never scheduled (no node matches), so no kubelet rewrites it.
	tkubectl(t, kc, `apiVersion: v1
kind: Pod
metadata: {name: forged, namespace: default}
spec:
  nodeSelector: {nowhere: "true"}
  containers: [{name: c, image: `+probeImage+`, imagePullPolicy: Never}]
`, "apply", "-f", "-")
	tkubectl(t, kc, "", "patch", "pod", "forged", "--subresource=status", "--type=merge", "-p",
		`{"status":{"podIP":"10.77.0.1","podIPs":[{"ip":"10.77.0.1"}]}}`)
	if ip := tkubectl(t, kc, "", "get", "pod", "forged", "-o", "jsonpath={.status.podIP}"); ip != "10.77.0.1" {
		t.Fatalf("the forged pod's IP is %q", ip)
	}
	out, err := tkubectlErr(kc, "get", "--raw", "/api/v1/namespaces/default/pods/forged:"+port+"/proxy/")
	if err == nil {
		t.Errorf("the pod proxy to the host's address answered: %q", out)
	}
	t.Logf("pod proxy to the host's address: %q", firstLine(out))
	if h := hits.Load(); h != 0 {
		t.Fatalf("the provider's host was reached %d times by the tenant apiserver", h)
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
