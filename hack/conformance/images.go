package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The conformance images, made from source and from this host's Debian packages rather than
// pulled. Two layers serve them all: a userland layer (upstream's busybox built from source,
// its ash as /bin/sh; netcat-openbsd, dig, curl from Debian, with the shared libraries they
// load) and a layer holding the agnhost binary built from k8s.io/kubernetes.

// layerEntry is one entry of a layer: a directory, a regular file or a symlink.
type layerEntry struct {
	Path string // inside the image, without a leading slash
	Mode int64
	Data []byte
	Link string // a symlink's target
	Dir  bool
}

// layerFromEntries packs entries (parents first, in path order) into a layer with fixed
// times, so the same inputs give the same digest on every run.
func layerFromEntries(entries []layerEntry) (v1.Layer, error) {
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	seen := map[string]bool{}
	var addParents func(p string) error
	addParents = func(p string) error {
		d := path.Dir(p)
		if d == "." || d == "/" || seen[d] {
			return nil
		}
		if err := addParents(d); err != nil {
			return err
		}
		seen[d] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch})
	}
	for _, e := range entries {
		if seen[e.Path] {
			continue
		}
		if err := addParents(e.Path); err != nil {
			return nil, err
		}
		seen[e.Path] = true
		var err error
		switch {
		case e.Dir:
			err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: e.Path + "/", Mode: e.Mode, ModTime: epoch})
		case e.Link != "":
			err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: e.Path, Linkname: e.Link, Mode: 0o777, ModTime: epoch})
		default:
			if err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.Path, Mode: e.Mode, Size: int64(len(e.Data)), ModTime: epoch}); err == nil {
				_, err = tw.Write(e.Data)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}

// hostTool is a program of this host copied into the userland layer, with the Debian
// package that provides it (named in the error when it is missing).
type hostTool struct {
	Host, Image, Package string
}

// No bash: no [Conformance] spec runs it. Upstream's busybox image has none; its agnhost
// image has, which two non-conformance probe specs run as /bin/bash.
var userlandTools = []hostTool{
	{"/bin/nc.openbsd", "usr/bin/nc", "netcat-openbsd"},
	{"/usr/bin/dig", "usr/bin/dig", "bind9-dnsutils"},
	{"/usr/bin/nslookup", "usr/bin/nslookup", "bind9-dnsutils"},
	{"/usr/bin/host", "usr/bin/host", "bind9-dnsutils"},
	{"/usr/bin/curl", "usr/bin/curl", "curl"},
	// The DNS specs' probes ask `getent hosts NAME` (glibc 2.36 has its files and dns
	// lookups built in: no NSS module to carry).
	{"/usr/bin/getent", "usr/bin/getent", "libc-bin"},
}

// lddLine matches "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and the loader's
// "/lib64/ld-linux-x86-64.so.2 (0x...)".
var lddLine = regexp.MustCompile(`(?m)^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$`)

// libsOf lists the shared libraries ldd says prog loads (none for a static program).
func libsOf(prog string) ([]string, error) {
	out, err := exec.Command("ldd", prog).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", prog, err, out)
	}
	var libs []string
	for _, m := range lddLine.FindAllStringSubmatch(string(out), -1) {
		libs = append(libs, m[1])
	}
	return libs, nil
}

// imageUser is a user the agnhost image defines (upstream's adduser lines).
const passwd = `root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh
`

const group = `root:x:0:
nogroup:x:65534:
user-defined-in-image:x:1000:
group-defined-in-image:x:50000:user-defined-in-image
`

// userlandLayer is the shared userland: the static busybox (buildBusybox's) and its
// applets, sh (ash) among them, nc, dig, nslookup, host, curl and getent with their
// libraries, and /etc basics.
func userlandLayer(busybox string) (v1.Layer, error) {
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	entries := []layerEntry{{Path: "bin/busybox", Mode: 0o755, Data: bb}}
	libs := map[string]bool{}
	for _, t := range userlandTools {
		b, err := os.ReadFile(t.Host)
		if err != nil {
			return nil, fmt.Errorf("%s (Debian package %s; apt-get install %s): %w", t.Host, t.Package, t.Package, err)
		}
		entries = append(entries, layerEntry{Path: t.Image, Mode: 0o755, Data: b})
		ls, err := libsOf(t.Host)
		if err != nil {
			return nil, err
		}
		for _, l := range ls {
			libs[l] = true
		}
	}
	for l := range libs {
		b, err := os.ReadFile(l) // through the host's links: the image gets the file itself
		if err != nil {
			return nil, err
		}
		entries = append(entries, layerEntry{Path: strings.TrimPrefix(l, "/"), Mode: 0o755, Data: b})
	}
	applets, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	names := strings.Fields(string(applets))
	if !slices.Contains(names, "sh") {
		return nil, fmt.Errorf("%s has no sh applet", busybox)
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Path] = true
	}
	for _, a := range names {
		// /bin/sh is busybox's ash, as in upstream's image: the read-only-root spec expects
		// its messages word for word. Upstream's ash passes on environment variables whose
		// names are not shell names ("data-1", set by envFrom), which the ConfigMap and
		// Secret env specs read back with `sh -c env` (Debian's reverts that), and with
		// FEATURE_SH_STANDALONE off it finds programs through PATH, so the nc, dig and curl
		// in /usr/bin are the ones a spec's `sh -c` runs; their applets are left out.
		if a == "busybox" || have["usr/bin/"+a] {
			continue
		}
		entries = append(entries, layerEntry{Path: "bin/" + a, Link: "busybox"})
	}
	entries = append(entries,
		layerEntry{Path: "etc/passwd", Mode: 0o644, Data: []byte(passwd)},
		layerEntry{Path: "etc/group", Mode: 0o644, Data: []byte(group)},
		layerEntry{Path: "etc/nsswitch.conf", Mode: 0o644, Data: []byte("passwd: files\ngroup: files\nhosts: files dns\n")},
		layerEntry{Path: "tmp", Mode: 0o1777, Dir: true},
		layerEntry{Path: "root", Mode: 0o700, Dir: true},
		layerEntry{Path: "home/user-defined-in-image", Mode: 0o755, Dir: true},
	)
	return layerFromEntries(entries)
}

// agnhostLayer is /agnhost (and /agnhost-2, which the entrypoint specs call), /uploads
// (netexec's), porter's localhost.crt and .key from the source tree, and the web files of
// kitten/nautilus' stand-ins.
func agnhostLayer(binary, srcDir string) (v1.Layer, error) {
	b, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	entries := []layerEntry{
		{Path: "agnhost", Mode: 0o755, Data: b},
		{Path: "agnhost-2", Link: "agnhost"},
		{Path: "uploads", Mode: 0o755, Dir: true},
	}
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		d, err := os.ReadFile(filepath.Join(srcDir, "porter", f))
		if err != nil {
			return nil, err
		}
		entries = append(entries, layerEntry{Path: f, Mode: 0o644, Data: d})
	}
	return layerFromEntries(entries)
}

// imageSpec is one image the suite names, as this harness makes it.
type imageSpec struct {
	// Repo is the path under the registry, Tags its versions (manifest.go's).
	Repo string
	Tags []string
	// Layers: "userland", "agnhost".
	Layers     []string
	Entrypoint []string
	Cmd        []string
	User       string
	// How says how it is made and how faithful it is (docs/conformance.md has the same).
	How string
}

// conformanceImages are the images of test/utils/image/manifest.go the [Conformance] specs
// run, by the repository names KUBE_TEST_REPO_LIST maps them to (see repoList).
var conformanceImages = []imageSpec{
	{Repo: "e2e-test-images/agnhost", Tags: []string{"2.66.1", "2.55"}, Layers: []string{"userland", "agnhost"},
		Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"},
		How: "agnhost built from source; the userland is Debian's (glibc) where upstream's is Alpine's (musl); 2.55 is the same build"},
	{Repo: "e2e-test-images/busybox", Tags: []string{"1.37.0-2"}, Layers: []string{"userland"}, Cmd: []string{"sh"},
		How: "upstream's busybox 1.37.0 built from source (static, defconfig), /bin/sh is its ash, as upstream"},
	{Repo: "k8s/pause", Tags: []string{"3.10.2"}, Layers: []string{"agnhost"}, Entrypoint: []string{"/agnhost", "pause"},
		How: "agnhost pause (waits for a signal) instead of the C pause binary"},
	{Repo: "e2e-test-images/nginx", Tags: []string{"1.27.0-2", "1.28.0-2"}, Layers: []string{"userland", "agnhost"},
		Entrypoint: []string{"/agnhost", "test-webserver", "--port", "80"},
		How:        "agnhost test-webserver on port 80 stands for nginx (an HTTP server on 80; no nginx config or pages)"},
	{Repo: "e2e-test-images/glibc-dns-testing", Tags: []string{"2.1.1"}, Layers: []string{"userland"}, Cmd: []string{"sh"},
		How: "Debian bookworm's dig and nslookup, as upstream (no coredns binary)"},
	{Repo: "e2e-test-images/nonroot", Tags: []string{"1.5"}, Layers: []string{"userland"}, Cmd: []string{"sh"}, User: "1234",
		How: "the userland with USER 1234, as upstream's debian-base with USER 1234"},
	{Repo: "e2e-test-images/kitten", Tags: []string{"1.8"}, Layers: []string{"userland", "agnhost", "kitten"},
		Entrypoint: []string{"/agnhost"}, Cmd: []string{"test-webserver"},
		How: "agnhost test-webserver serving test/images/kitten/html's kitten.jpg and data.json at /, as upstream"},
	{Repo: "e2e-test-images/nautilus", Tags: []string{"1.8"}, Layers: []string{"userland", "agnhost", "nautilus"},
		Entrypoint: []string{"/agnhost"}, Cmd: []string{"test-webserver"},
		How: "agnhost test-webserver serving test/images/nautilus/html's nautilus.jpg and data.json at /, as upstream"},
	{Repo: "e2e-test-images/sample-apiserver", Tags: []string{"1.29.2"}, Layers: []string{"userland", "sample-apiserver"},
		Entrypoint: []string{"/sample-apiserver"},
		How:        "k8s.io/sample-apiserver of the Kubernetes version the project builds (newer than upstream's image 1.29.2), CGO_ENABLED=0"},
	{Repo: "e2e-test-images/nonewprivs", Tags: []string{"1.4"}, Layers: []string{"userland", "nonewprivs"}, Cmd: []string{"nnp"},
		How: "test/images/nonewprivs built from source (CGO_ENABLED=0), setuid root at /usr/local/bin/nnp, as upstream"},
	{Repo: "k8s/etcd", Tags: []string{"3.7.0-0"}, Layers: []string{"userland", "etcd"},
		Entrypoint: []string{"/usr/local/bin/etcd"},
		How:        "the etcd server the project embeds (go.etcd.io/etcd/server/v3's etcdmain) at /usr/local/bin/etcd"},
}

// buildImages assembles every image of conformanceImages from the layers: the userland,
// agnhost, and one binary each for the Aggregator spec's sample-apiserver and etcd.
func buildImages(t tools, agnhostSrc string) (map[string]v1.Image, error) {
	ul, err := userlandLayer(t.busybox)
	if err != nil {
		return nil, fmt.Errorf("userland layer: %w", err)
	}
	al, err := agnhostLayer(t.agnhost, agnhostSrc)
	if err != nil {
		return nil, fmt.Errorf("agnhost layer: %w", err)
	}
	layers := map[string]v1.Layer{"userland": ul, "agnhost": al}
	for name, b := range map[string]struct {
		bin, path string
		mode      int64
	}{
		"sample-apiserver": {t.sampleAPIServer, "sample-apiserver", 0o755},
		"etcd":             {t.etcd, "usr/local/bin/etcd", 0o755},
		// Setuid root: the spec runs it as uid 1000 and reads the effective uid it got.
		"nonewprivs": {t.nonewprivs, "usr/local/bin/nnp", 0o4755},
	} {
		data, err := os.ReadFile(b.bin)
		if err != nil {
			return nil, err
		}
		if layers[name], err = layerFromEntries([]layerEntry{{Path: b.path, Mode: b.mode, Data: data}}); err != nil {
			return nil, fmt.Errorf("%s layer: %w", name, err)
		}
	}
	// kitten and nautilus: the Update Demo specs read data.json through the pod proxy.
	for _, name := range []string{"kitten", "nautilus"} {
		html := filepath.Join(filepath.Dir(agnhostSrc), name, "html")
		var entries []layerEntry
		for _, f := range []string{name + ".jpg", "data.json"} {
			data, err := os.ReadFile(filepath.Join(html, f))
			if err != nil {
				return nil, err
			}
			entries = append(entries, layerEntry{Path: f, Mode: 0o644, Data: data})
		}
		if layers[name], err = layerFromEntries(entries); err != nil {
			return nil, fmt.Errorf("%s layer: %w", name, err)
		}
	}
	return buildImagesFrom(layers)
}

// buildImagesFrom assembles every image of conformanceImages from the named layers.
func buildImagesFrom(layers map[string]v1.Layer) (map[string]v1.Image, error) {
	out := map[string]v1.Image{}
	var err error
	for _, s := range conformanceImages {
		img := empty.Image
		for _, l := range s.Layers {
			if layers[l] == nil {
				return nil, fmt.Errorf("image %s: no layer %q", s.Repo, l)
			}
			if img, err = mutate.AppendLayers(img, layers[l]); err != nil {
				return nil, err
			}
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", "amd64"
		cf.Config = v1.Config{
			Entrypoint: s.Entrypoint, Cmd: s.Cmd, User: s.User, WorkingDir: "/",
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		}
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return nil, err
		}
		out[s.Repo] = img
	}
	return out, nil
}

// imageRefs are every registry reference of the images: REGISTRY/REPO:TAG.
func imageRefs(registry string, imgs map[string]v1.Image) (map[name.Reference]v1.Image, error) {
	refs := map[name.Reference]v1.Image{}
	for _, s := range conformanceImages {
		for _, tag := range s.Tags {
			r, err := name.NewTag(registry+"/"+s.Repo+":"+tag, name.Insecure)
			if err != nil {
				return nil, err
			}
			refs[r] = imgs[s.Repo]
		}
	}
	return refs, nil
}
