package denodist

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

func TestPinFromLock(t *testing.T) {
	const good = "sha512-3md4TKLCuzsLDmfOoC5KN7NAZaxSVkMgm64vg6foD00JBADCpYS2/5QqXfzgnP5ZQz3iLP9vBQJtEgc116OAoQ=="
	lock := func(lv int, denoV, pkgV, integrity string) []byte {
		b, _ := json.Marshal(map[string]any{
			"lockfileVersion": lv,
			"packages": map[string]any{
				"node_modules/deno":                  map[string]string{"version": denoV},
				"node_modules/@deno/linux-x64-glibc": map[string]string{"version": pkgV, "integrity": integrity},
			},
		})
		return b
	}
	for _, tc := range []struct {
		name    string
		lock    []byte
		pkg     string
		want    Pin
		wantErr string
	}{
		{name: "the platform package of the pinned deno", lock: lock(3, "2.9.6", "2.9.6", good), pkg: "@deno/linux-x64-glibc",
			want: Pin{Version: "2.9.6", Package: "@deno/linux-x64-glibc", Integrity: good}},
		{name: "another platform is not in it", lock: lock(3, "2.9.6", "2.9.6", good), pkg: "@deno/linux-arm64-glibc", wantErr: "no node_modules/@deno/linux-arm64-glibc"},
		{name: "the platform package of another version", lock: lock(3, "2.9.6", "2.9.5", good), pkg: "@deno/linux-x64-glibc", wantErr: "but deno 2.9.6"},
		{name: "a sha1 integrity is refused", lock: lock(3, "2.9.6", "2.9.6", "sha1-abc"), pkg: "@deno/linux-x64-glibc", wantErr: "want sha512-"},
		{name: "a lockfile v1 has no packages map", lock: lock(1, "2.9.6", "2.9.6", good), pkg: "@deno/linux-x64-glibc", wantErr: "lockfileVersion 1"},
		{name: "not JSON", lock: []byte("{"), pkg: "@deno/linux-x64-glibc", wantErr: "pinned lockfile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pinFromLock(tc.lock, tc.pkg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// The embedded lockfile and package.json pin the same deno, which hack/install-deno.sh
// installs for the tests.
func TestPinnedMatchesPackageJSON(t *testing.T) {
	p, err := pinnedFor("linux", "amd64")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := npmFiles.ReadFile("npm/package.json")
	var pj struct{ Dependencies map[string]string }
	if err := json.Unmarshal(b, &pj); err != nil {
		t.Fatal(err)
	}
	if pj.Dependencies["deno"] != p.Version {
		t.Fatalf("package.json pins deno %q, the lockfile %q", pj.Dependencies["deno"], p.Version)
	}
	if got, want := p.TarballPath(), "@deno/linux-x64-glibc/-/linux-x64-glibc-"+p.Version+".tgz"; got != want {
		t.Fatalf("TarballPath = %q, want %q", got, want)
	}
	if _, err := pinnedFor("darwin", "arm64"); !errors.As(err, new(*UnsupportedError)) {
		t.Fatalf("darwin: err = %v, want UnsupportedError", err)
	}
}

// fakePackage is a platform package tarball whose package/deno is a script printing version.
func fakePackage(t *testing.T, entry, version string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	files := map[string]string{
		"package/package.json": `{"name":"@deno/linux-x64-glibc"}`,
		entry:                  "#!/bin/sh\necho 'deno " + version + " (stable, release, x86_64-unknown-linux-gnu)'\n",
	}
	for _, name := range []string{"package/package.json", entry} {
		body := files[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	zw.Close()
	sum := sha512.Sum512(buf.Bytes())
	return buf.Bytes(), encodeIntegrity(sum[:])
}

// registry serves body at the pin's tarball path on loopback and counts requests.
func registry(t *testing.T, pin Pin, body []byte) (string, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path != "/"+pin.TarballPath() {
			http.NotFound(w, r)
			return
		}
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &hits
}

func TestInstall(t *testing.T) {
	ctx := context.Background()
	pkg, integrity := fakePackage(t, "package/deno", "9.9.9")
	pin := Pin{Version: "9.9.9", Package: "@deno/linux-x64-glibc", Integrity: integrity}

	t.Run("from the registry, checked, then kept", func(t *testing.T) {
		url, hits := registry(t, pin, pkg)
		dir := t.TempDir()
		var progressed int64
		r, err := Install(ctx, pin, dir, Source{Registry: url}, func(done, total int64) { progressed = done })
		if err != nil {
			t.Fatal(err)
		}
		if r.Binary != filepath.Join(dir, "deno") || !strings.HasPrefix(r.From, url+"/") || progressed != int64(len(pkg)) {
			t.Fatalf("got %+v, progress %d of %d", r, progressed, len(pkg))
		}
		again, err := Install(ctx, pin, dir, Source{Registry: url}, nil)
		if err != nil || again.From != "installed" || hits.Load() != 1 {
			t.Fatalf("second install: %+v, %v, %d requests", again, err, hits.Load())
		}
		assertOnlyBinary(t, dir)
	})

	t.Run("bytes other than the pinned ones are refused and nothing is unpacked", func(t *testing.T) {
		other, _ := fakePackage(t, "package/deno", "9.9.9")
		other = append(other, 0) // trailing byte: gzip still reads it, the digest differs
		url, _ := registry(t, pin, other)
		dir := t.TempDir()
		_, err := Install(ctx, pin, dir, Source{Registry: url}, nil)
		var ie *IntegrityError
		if !errors.As(err, &ie) || ie.Want != integrity {
			t.Fatalf("err = %v, want IntegrityError", err)
		}
		assertEmpty(t, dir)
	})

	t.Run("a registry without the package", func(t *testing.T) {
		url, _ := registry(t, Pin{Package: "@deno/other", Version: "1"}, pkg)
		_, err := Install(ctx, pin, t.TempDir(), Source{Registry: url}, nil)
		if fe := new(FetchError); !errors.As(err, &fe) || !strings.Contains(err.Error(), "404") {
			t.Fatalf("err = %v, want FetchError 404", err)
		}
	})

	t.Run("from npm's cache without asking the registry", func(t *testing.T) {
		url, hits := registry(t, pin, pkg)
		cache := t.TempDir()
		path := writeCache(t, cache, pkg)
		dir := t.TempDir()
		r, err := Install(ctx, pin, dir, Source{Registry: url, NPMCache: cache}, nil)
		if err != nil || r.From != path || hits.Load() != 0 {
			t.Fatalf("got %+v, %v, %d registry requests", r, err, hits.Load())
		}
	})

	t.Run("a corrupt cache entry is passed over for the registry", func(t *testing.T) {
		url, hits := registry(t, pin, pkg)
		cache := t.TempDir()
		path := writeCache(t, cache, pkg)
		os.WriteFile(path, []byte("corrupt"), 0o644)
		r, err := Install(ctx, pin, t.TempDir(), Source{Registry: url, NPMCache: cache}, nil)
		if err != nil || !strings.HasPrefix(r.From, url) || hits.Load() != 1 {
			t.Fatalf("got %+v, %v, %d registry requests", r, err, hits.Load())
		}
	})

	t.Run("a package without the binary", func(t *testing.T) {
		other, otherIntegrity := fakePackage(t, "package/bin/deno", "9.9.9")
		p := pin
		p.Integrity = otherIntegrity
		url, _ := registry(t, p, other)
		dir := t.TempDir()
		_, err := Install(ctx, p, dir, Source{Registry: url}, nil)
		if pe := new(PackageError); !errors.As(err, &pe) || !strings.Contains(err.Error(), "no package/deno") {
			t.Fatalf("err = %v, want PackageError", err)
		}
		assertEmpty(t, dir)
	})

	t.Run("a binary of another version is not installed", func(t *testing.T) {
		other, otherIntegrity := fakePackage(t, "package/deno", "1.0.0")
		p := pin
		p.Integrity = otherIntegrity
		url, _ := registry(t, p, other)
		dir := t.TempDir()
		_, err := Install(ctx, p, dir, Source{Registry: url}, nil)
		if pe := new(PackageError); !errors.As(err, &pe) || !strings.Contains(err.Error(), "want deno 9.9.9") {
			t.Fatalf("err = %v, want PackageError", err)
		}
		assertEmpty(t, dir)
	})
}

func writeCache(t *testing.T, cache string, body []byte) string {
	t.Helper()
	sum := sha512.Sum512(body)
	path := cachePath(cache, sum[:])
	h := hex.EncodeToString(sum[:])
	if !strings.HasSuffix(path, filepath.Join(h[:2], h[2:4], h[4:])) {
		t.Fatalf("cache path %s", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, body, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	if es, _ := os.ReadDir(dir); len(es) != 0 {
		t.Fatalf("%s holds %v after a refused install", dir, es)
	}
}

func assertOnlyBinary(t *testing.T, dir string) {
	t.Helper()
	es, _ := os.ReadDir(dir)
	if len(es) != 1 || es[0].Name() != "deno" {
		t.Fatalf("%s holds %v, want only deno", dir, es)
	}
}

func TestDefaultSource(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	for _, k := range []string{"npm_config_registry", "NPM_CONFIG_REGISTRY", "npm_config_cache", "NPM_CONFIG_CACHE"} {
		t.Setenv(k, "")
	}
	if s := DefaultSource(); s.Registry != DefaultRegistry || s.NPMCache != filepath.Join(home, ".npm") {
		t.Fatalf("defaults: %+v", s)
	}
	os.WriteFile(filepath.Join(home, ".npmrc"), []byte("; a comment\nregistry = http://127.0.0.1:4873/\ncache=/var/cache/npm\n"), 0o600)
	if s := DefaultSource(); s.Registry != "http://127.0.0.1:4873" || s.NPMCache != "/var/cache/npm" {
		t.Fatalf(".npmrc: %+v", s)
	}
	t.Setenv("npm_config_registry", "http://127.0.0.1:9/")
	if s := DefaultSource(); s.Registry != "http://127.0.0.1:9" {
		t.Fatalf("env: %+v", s)
	}
}
