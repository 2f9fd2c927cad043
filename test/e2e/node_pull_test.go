package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// RegistryIP serves the test registry inside the internet namespace.
const registryIP = "198.51.100.69"

// testRegistry is an OCI registry (go-containerregistry's) in the internet namespace at
// registryIP:5000, plain HTTP; repositories under private/ answer 401 without the basic
// credentials user:pass.
type testRegistry struct {
	Host       string // registryIP:5000
	User, Pass string
}

func startTestRegistry(t *testing.T, in *substratetest.Internet) *testRegistry {
	t.Helper()
	r := &testRegistry{Host: registryIP + ":5000", User: "puller", Pass: "s3cret-pull"}
	in.IP(t, "addr", "add", registryIP+"/32", "dev", "lo")
	var ln net.Listener
	var err error
	in.In(t, func() { ln, err = net.Listen("tcp", r.Host) })
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.New(registry.Logger(nopLogger()))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.HasPrefix(req.URL.Path, "/v2/private/") {
			u, p, ok := req.BasicAuth()
			if !ok || u != r.User || p != r.Pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
		}
		reg.ServeHTTP(w, req)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return r
}

// push writes a busybox image with extra files (name -> size in bytes of random data) to
// repo:tag and returns its reference.
func (r *testRegistry) push(t *testing.T, repo string, extra map[string]int) string {
	t.Helper()
	bb, err := os.ReadFile(node.BusyboxStatic)
	if err != nil {
		t.Fatal(err)
	}
	// One layer: busybox executable, the extra files readable.
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	add := func(name string, mode int64, data []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	add("bin/busybox", 0o755, bb)
	for f, n := range extra {
		// Random: a layer is gzip'd, and the figure is of n bytes on the wire.
		b := make([]byte, n)
		_, _ = rand.NewChaCha8([32]byte{1}).Read(b)
		add(f, 0o644, b)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Entrypoint: []string{"/bin/busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(r.Host+"/"+repo, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithAuth(&authn.Basic{Username: r.User, Password: r.Pass})); err != nil {
		t.Fatal(err)
	}
	return r.Host + "/" + repo
}

// hostsConfig is the operator's registry configuration for the test registry: plain HTTP.
func (r *testRegistry) hostsConfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, r.Host), 0o700); err != nil {
		t.Fatal(err)
	}
	toml := fmt.Sprintf("server = \"http://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", r.Host, r.Host)
	if err := os.WriteFile(filepath.Join(dir, r.Host, "hosts.toml"), []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func pulledPod(name, image, extra string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: default}
spec:
  automountServiceAccountToken: false
  restartPolicy: Never
` + extra + `  containers:
  - name: c
    image: ` + image + `
    command: ["/bin/busybox", "echo", "pulled and ran"]
`
}

// A node pulls the images of its pods from a registry (no tarball, no imagePullPolicy
// Never), through the operator's registry configuration; a private repository needs the
// pod's imagePullSecrets, and without them the pod reports the pull refused.
func TestNode_PullsFromARegistry(t *testing.T) {
	t.Parallel()
	in := substratetest.NewInternet(t)
	reg := startTestRegistry(t, in)
	public := reg.push(t, "public/busybox:v1", nil)
	private := reg.push(t, "private/busybox:v1", nil)

	n := startNodeUp(t, "--node-registry-config", reg.hostsConfig(t))
	kc := n.cluster("p1", "maxNodes: 1, scaleHold: 30s")

	tkubectl(t, kc, pulledPod("public", public, ""), "apply", "-f", "-")
	var nodeName string
	for name := range n.waitClaimsRunning("p1", 1, 120*time.Second) {
		nodeName = name
	}
	waitPod(t, kc, "public", "Succeeded", nodeName, 120*time.Second)
	if out := tkubectl(t, kc, "", "logs", "public"); !strings.Contains(out, "pulled and ran") {
		t.Errorf("logs of the pulled image's pod: %q", out)
	}
	if ev := tkubectl(t, kc, "", "get", "events", "--field-selector", "involvedObject.name=public", "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}"); !strings.Contains(ev, "Successfully pulled image") {
		t.Errorf("no pull event:\n%s", ev)
	}

	tkubectl(t, kc, pulledPod("nosecret", private, ""), "apply", "-f", "-")
	testenv.Eventually(t, 60*time.Second, "the private image refused without credentials", func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "pod", "nosecret", "-o", "jsonpath={.status.containerStatuses[0].state.waiting.reason}")
		return out == "ErrImagePull" || out == "ImagePullBackOff", fmt.Errorf("waiting reason %q", out)
	})

	auth := base64.StdEncoding.EncodeToString([]byte(reg.User + ":" + reg.Pass))
	tkubectl(t, kc, fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: pull, namespace: default}
type: kubernetes.io/dockerconfigjson
stringData:
  .dockerconfigjson: '{"auths": {%q: {"auth": %q}}}'
`, reg.Host, auth), "apply", "-f", "-")
	tkubectl(t, kc, pulledPod("withsecret", private, "  imagePullSecrets: [{name: pull}]\n"), "apply", "-f", "-")
	waitPod(t, kc, "withsecret", "Succeeded", nodeName, 120*time.Second)
}

func nopLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// TestBench_NodeImagePull100MB prints how long a node takes to pull a 100 MB image from a
// registry in the internet namespace (the kubelet's own figure, from its Pulled event), and
// the pod's create-to-Succeeded time with that pull in it.
func TestBench_NodeImagePull100MB(t *testing.T) {
	benchGate(t)
	in := substratetest.NewInternet(t)
	reg := startTestRegistry(t, in)
	big := reg.push(t, "public/big:v1", map[string]int{"data/blob": 100 << 20})
	n := startNodeUp(t, "--node-registry-config", reg.hostsConfig(t))
	kc := n.cluster("b1", "maxNodes: 1, scaleHold: 30s")
	// A node first, so the figure is the pull and not the node's boot.
	tkubectl(t, kc, spreadPod("holder"), "apply", "-f", "-")
	var nodeName string
	for name := range n.waitClaimsRunning("b1", 1, 120*time.Second) {
		nodeName = name
	}
	waitPod(t, kc, "holder", "Running", nodeName, 90*time.Second)
	t0 := time.Now()
	tkubectl(t, kc, pulledPod("big", big, ""), "apply", "-f", "-")
	waitPod(t, kc, "big", "Succeeded", nodeName, 180*time.Second)
	total := time.Since(t0)
	ev := tkubectl(t, kc, "", "get", "events", "--field-selector", "involvedObject.name=big,reason=Pulled", "-o", "jsonpath={.items[0].message}")
	t.Logf("bench: 100 MB image pull: %s", ev)
	t.Logf("bench: pod created -> Succeeded with the pull: %.2fs", total.Seconds())
}
