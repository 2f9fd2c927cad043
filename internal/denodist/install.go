package denodist

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// DefaultRegistry is npm's default registry.
const DefaultRegistry = "https://registry.npmjs.org"

// Source is where the package comes from.
type Source struct {
	// Registry is the npm registry's base URL.
	Registry string
	// NPMCache is npm's cache dir (npm's "cache" setting, ~/.npm by default); "" reads no
	// cache.
	NPMCache string
	// Client fetches from Registry; nil is a client with a 10-minute timeout that honours
	// the proxy environment.
	Client *http.Client
}

// DefaultSource is the registry and cache npm itself would use: $npm_config_registry
// (either case), else the registry line of ~/.npmrc, else registry.npmjs.org; the cache at
// $npm_config_cache, else ~/.npm.
func DefaultSource() Source {
	home, _ := os.UserHomeDir()
	s := Source{Registry: DefaultRegistry}
	if r := npmSetting("registry", home); r != "" {
		s.Registry = r
	}
	s.Registry = strings.TrimRight(s.Registry, "/")
	if c := npmSetting("cache", home); c != "" {
		s.NPMCache = c
	} else if home != "" {
		s.NPMCache = filepath.Join(home, ".npm")
	}
	return s
}

// npmSetting is npm's setting key from the environment, else from ~/.npmrc.
func npmSetting(key, home string) string {
	for _, env := range []string{"npm_config_" + key, "NPM_CONFIG_" + strings.ToUpper(key)} {
		if v := os.Getenv(env); v != "" {
			return v
		}
	}
	if home == "" {
		return ""
	}
	f, err := os.Open(filepath.Join(home, ".npmrc"))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// Progress reports bytes of the package read so far, of total (-1 when unknown).
type Progress func(done, total int64)

// Result says what Install did.
type Result struct {
	// Binary is the installed deno.
	Binary string
	// From is where the package came from: "installed" (it already was), npm's cache path,
	// or the registry URL.
	From string
}

// Install puts the pinned Deno of pin into dir (Pin.Dir by default) unless it is there: from
// npm's cache when the package is in it, else from the registry. The package's bytes are
// checked against pin.Integrity before anything is unpacked, and the binary must report
// pin.Version; only then is it renamed into place, so a binary in dir is always a checked
// one. Errors: *IntegrityError, *FetchError, *PackageError.
func Install(ctx context.Context, pin Pin, dir string, src Source, progress Progress) (Result, error) {
	if dir == "" {
		dir = pin.Dir()
		if dir == "" {
			return Result{}, errors.New("denodist: no user cache dir ($HOME and $XDG_CACHE_HOME unset); set SOCIALWEB_DENO=PATH")
		}
	}
	if p := Installed(dir); p != "" {
		return Result{Binary: p, From: "installed"}, nil
	}
	want, err := decodeIntegrity(pin.Integrity)
	if err != nil {
		return Result{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Result{}, err
	}
	tgz, err := os.CreateTemp(dir, ".package-*.tgz")
	if err != nil {
		return Result{}, err
	}
	defer os.Remove(tgz.Name())
	defer tgz.Close()

	from := ""
	if path := cachePath(src.NPMCache, want); path != "" {
		if f, err := os.Open(path); err == nil {
			got, cerr := copyHashed(tgz, f, sizeOf(f), progress)
			f.Close()
			if cerr == nil && bytes.Equal(got, want) {
				from = path
			}
			// A cache entry that does not match is npm's corruption, not an answer: the
			// registry is asked instead.
		}
	}
	if from == "" {
		if err := resetFile(tgz); err != nil {
			return Result{}, err
		}
		url := src.Registry + "/" + pin.TarballPath()
		if err := fetch(ctx, src.client(), url, tgz, want, progress); err != nil {
			return Result{}, err
		}
		from = url
	}
	bin, err := unpack(tgz, dir, pin.Version, from)
	if err != nil {
		return Result{}, err
	}
	return Result{Binary: bin, From: from}, nil
}

func (s Source) client() *http.Client {
	if s.Client != nil {
		return s.Client
	}
	return &http.Client{Timeout: 10 * time.Minute}
}

// decodeIntegrity is the sha512 digest of an SRI string "sha512-<base64>".
func decodeIntegrity(sri string) ([]byte, error) {
	b64, ok := strings.CutPrefix(sri, "sha512-")
	if !ok {
		return nil, fmt.Errorf("denodist: integrity %q is not sha512", sri)
	}
	d, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(d) != sha512.Size {
		return nil, fmt.Errorf("denodist: integrity %q is not a sha512 digest", sri)
	}
	return d, nil
}

func encodeIntegrity(d []byte) string { return "sha512-" + base64.StdEncoding.EncodeToString(d) }

// CachedIn is where npm's cache at npmCache keeps this package's bytes (which may not be
// there); "" without a cache or with an unreadable integrity.
func (p Pin) CachedIn(npmCache string) string {
	d, err := decodeIntegrity(p.Integrity)
	if err != nil {
		return ""
	}
	return cachePath(npmCache, d)
}

// cachePath is where npm's content-addressed cache (cacache, content-v2) keeps the bytes of
// digest; "" without a cache.
func cachePath(cache string, digest []byte) string {
	if cache == "" {
		return ""
	}
	h := hex.EncodeToString(digest)
	return filepath.Join(cache, "_cacache", "content-v2", "sha512", h[:2], h[2:4], h[4:])
}

func sizeOf(f *os.File) int64 {
	if fi, err := f.Stat(); err == nil {
		return fi.Size()
	}
	return -1
}

func resetFile(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.Seek(0, io.SeekStart)
	return err
}

// copyHashed copies r (total bytes, -1 unknown) to w, reporting progress, and returns the
// sha512 of what it copied.
func copyHashed(w io.Writer, r io.Reader, total int64, progress Progress) ([]byte, error) {
	h := sha512.New()
	if _, err := io.Copy(io.MultiWriter(w, h), &progressReader{r: r, total: total, progress: progress}); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// fetch GETs url into w and checks its bytes against want.
func fetch(ctx context.Context, c *http.Client, url string, w io.Writer, want []byte, progress Progress) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return &FetchError{URL: url, Reason: err.Error()}
	}
	resp, err := c.Do(req)
	if err != nil {
		return &FetchError{URL: url, Reason: err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &FetchError{URL: url, Reason: resp.Status}
	}
	got, err := copyHashed(w, resp.Body, resp.ContentLength, progress)
	if err != nil {
		return &FetchError{URL: url, Reason: err.Error()}
	}
	if !bytes.Equal(got, want) {
		return &IntegrityError{From: url, Want: encodeIntegrity(want), Got: encodeIntegrity(got)}
	}
	return nil
}

type progressReader struct {
	r        io.Reader
	done     int64
	total    int64
	progress Progress
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.done += int64(n)
	if p.progress != nil && n > 0 {
		p.progress(p.done, p.total)
	}
	return n, err
}

// unpack writes the checked tarball's package/deno into dir, runs it for its version, and
// renames it into place.
func unpack(tgz *os.File, dir, version, from string) (string, error) {
	if _, err := tgz.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	zr, err := gzip.NewReader(tgz)
	if err != nil {
		return "", &PackageError{From: from, Reason: "not gzip: " + err.Error()}
	}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return "", &PackageError{From: from, Reason: "no package/" + BinaryName + " in the package"}
		}
		if err != nil {
			return "", &PackageError{From: from, Reason: "not a tar: " + err.Error()}
		}
		if hdr.Name != "package/"+BinaryName || hdr.Typeflag != tar.TypeReg {
			continue
		}
		return place(tr, dir, version, from)
	}
}

func place(r io.Reader, dir, version, from string) (string, error) {
	tmp, err := os.CreateTemp(dir, ".deno-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	out, err := exec.Command(tmp.Name(), "--version").Output()
	if err != nil {
		return "", &PackageError{From: from, Reason: "its deno does not run: " + err.Error()}
	}
	first, _, _ := strings.Cut(string(out), "\n")
	if !strings.HasPrefix(first, "deno "+version+" ") {
		return "", &PackageError{From: from, Reason: fmt.Sprintf("its deno reports %q, want deno %s", first, version)}
	}
	bin := filepath.Join(dir, BinaryName)
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// LineProgress is a Progress that prints a line through printf at most once a second, and
// the last one when the package is complete: "deno 2.9.6: 12.0 of 40.3 MiB".
func LineProgress(pin Pin, printf func(format string, a ...any)) Progress {
	last := time.Now() // a fetch done within a second prints only its last line
	return func(done, total int64) {
		complete := total > 0 && done >= total
		if !complete && time.Since(last) < time.Second {
			return
		}
		last = time.Now()
		if total > 0 {
			printf("deno %s: %.1f of %.1f MiB", pin.Version, mib(done), mib(total))
		} else {
			printf("deno %s: %.1f MiB", pin.Version, mib(done))
		}
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
