package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// The registry serves the images inside the internet namespace: the host reaches it through
// the route, a pushed image reads back with the same digest, and without the route the host
// cannot reach it (nothing of it listens on the host).
func TestRegistryServesFromTheInternetNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	_ = os.MkdirAll(cacheDir, 0o755)
	lock, err := os.OpenFile(filepath.Join(cacheDir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Skip("a conformance run holds the namespace's fixed addresses")
	}
	if err := makeInternet(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(removeInternet)
	srv, err := serveRegistry()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })

	layer, err := layerFromEntries([]layerEntry{{Path: "hello", Mode: 0o644, Data: []byte("hello")}})
	if err != nil {
		t.Fatal(err)
	}
	imgs := map[string]v1.Image{}
	for _, s := range conformanceImages {
		imgs[s.Repo] = mustImage(t, layer)
	}
	refs, err := imageRefs(registryAddr, imgs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := push(ctx, refs); err != nil {
		t.Fatal(err)
	}
	r, _ := name.NewTag(registryAddr+"/e2e-test-images/agnhost:2.66.1", name.Insecure)
	got, err := remote.Image(r, remote.WithContext(ctx), remote.WithTransport(directTransport()))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := refs[findRef(refs, r.String())].Digest()
	if d, _ := got.Digest(); d != want {
		t.Errorf("pulled %s, pushed %s", d, want)
	}

	// Without the host route the registry is out of the host's reach (an unreachable route,
	// not none: a packet for the address must never take the host's default route).
	if err := ipCmd("route", "replace", "unreachable", registryIP+"/32"); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", registryAddr, 2*time.Second); err == nil {
		c.Close()
		t.Errorf("the host reached %s without the route: the registry is not in the namespace", registryAddr)
	}
}

func mustImage(t *testing.T, l v1.Layer) v1.Image {
	t.Helper()
	imgs, err := buildImagesFrom(map[string]v1.Layer{"userland": l, "agnhost": l, "sample-apiserver": l, "etcd": l, "nonewprivs": l, "kitten": l, "nautilus": l})
	if err != nil {
		t.Fatal(err)
	}
	return imgs["e2e-test-images/busybox"]
}

func findRef(refs map[name.Reference]v1.Image, s string) name.Reference {
	for r := range refs {
		if r.String() == s {
			return r
		}
	}
	return nil
}
