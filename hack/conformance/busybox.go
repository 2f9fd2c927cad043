package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// The userland's busybox is upstream's, built here: Debian's busybox reverts upstream's
// ash change that keeps environment variables whose names are not shell names (Debian's
// debian/patches/revert-9c143ce52da11ec3d21a3491c3749841d3dc10f0.patch, for its
// installer), and the ConfigMap and Secret env specs read back envFrom's `data-1` with
// `sh -c env`. Upstream's e2e busybox image is upstream's busybox, whose ash messages the
// read-only-root spec expects word for word. The source is Debian's copy of upstream's
// tarball (the .orig of its package, byte for byte the release), pinned by its sha256.
const (
	busyboxVersion = "1.37.0"
	busyboxURL     = "http://deb.debian.org/debian/pool/main/b/busybox/busybox_1.37.0.orig.tar.bz2"
	busyboxSHA256  = "3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4"
)

// busyboxOption is one change to upstream's defconfig: Value "y", or "" for off.
type busyboxOption struct {
	Name, Value string
}

// busyboxConfig is upstream's defconfig with these changes, and no others.
// FEATURE_SH_STANDALONE and FEATURE_PREFER_APPLETS stay off, as in defconfig: ash finds
// programs through PATH, so the image's nc, dig and curl in /usr/bin are the ones `sh -c`
// runs, not applets of the same names.
var busyboxConfig = []busyboxOption{
	// One file with no libraries to carry into the image.
	{"CONFIG_STATIC", "y"},
}

// busyboxMakeEnv is the build's environment beyond the host's: no build time in the
// version banner, so the same source and config give the same binary (and layer digest).
var busyboxMakeEnv = []string{"KCONFIG_NOTIMESTAMP=1"}

// busyboxKey names a build: the tarball, the config changes and the build's environment.
// The cache keeps one binary per key.
func busyboxKey() string {
	h := sha256.New()
	h.Write([]byte(busyboxSHA256 + "\n"))
	for _, o := range busyboxConfig {
		fmt.Fprintf(h, "%s=%s\n", o.Name, o.Value)
	}
	for _, e := range busyboxMakeEnv {
		fmt.Fprintf(h, "env %s\n", e)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// buildBusybox returns the path of the static busybox under cache (cacheDir's busybox/),
// fetching the tarball and building it when no binary of this key is there yet.
func buildBusybox(ctx context.Context, cache string) (string, error) {
	dir := filepath.Join(cache, "busybox")
	bin := filepath.Join(dir, busyboxKey(), "busybox")
	if exists(bin) {
		say("busybox %s is built (%s)", busyboxVersion, bin)
		return bin, nil
	}
	if err := busyboxBuildTools(); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tarball, err := busyboxSource(ctx, dir)
	if err != nil {
		return "", err
	}
	work, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	start := time.Now()
	jobs := runtime.NumCPU()
	say("building busybox %s from source (make -j%d; minutes when cold, log %s)", busyboxVersion, jobs, filepath.Join(dir, "build.log"))
	built, err := makeBusybox(ctx, tarball, work, jobs, filepath.Join(dir, "build.log"))
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	// Into place by rename: a run and a test building at once each leave a whole file.
	if err := os.Rename(built, bin); err != nil {
		return "", err
	}
	say("built busybox %s in %s (%s)", busyboxVersion, since(start), bin)
	return bin, nil
}

// busyboxBuildTools says which program the build needs and this host lacks.
func busyboxBuildTools() error {
	for _, p := range []string{"gcc", "make", "tar", "bzip2"} {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("building busybox %s needs %s (apt-get install build-essential bzip2): %w", busyboxVersion, p, err)
		}
	}
	return nil
}

// busyboxSource is the checked tarball in dir, fetched when it is not there.
func busyboxSource(ctx context.Context, dir string) (string, error) {
	path := filepath.Join(dir, filepath.Base(busyboxURL))
	if f, err := os.Open(path); err == nil {
		h := sha256.New()
		_, err := io.Copy(h, f)
		f.Close()
		if err == nil && hex.EncodeToString(h.Sum(nil)) == busyboxSHA256 {
			return path, nil
		}
		_ = os.Remove(path) // damaged: fetched again
	}
	start := time.Now()
	say("fetching %s", busyboxURL)
	tmp, err := os.CreateTemp(dir, ".tarball-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	got, err := fetchSHA256(ctx, busyboxURL, tmp)
	if err != nil {
		return "", &busyboxFetchError{Err: err, Path: path}
	}
	if got != busyboxSHA256 {
		return "", fmt.Errorf("busybox %s source from %s has sha256 %s, want %s: not the pinned release; not used", busyboxVersion, busyboxURL, got, busyboxSHA256)
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", err
	}
	say("fetched busybox %s source in %s", busyboxVersion, since(start))
	return path, nil
}

// busyboxFetchError is the source tarball out of reach.
type busyboxFetchError struct {
	Err  error
	Path string // where a copy would be taken from
}

func (e *busyboxFetchError) Error() string {
	return fmt.Sprintf("fetch busybox %s source: %v; the conformance images' busybox is built from it: reach deb.debian.org over HTTP (no proxy is used), or put the file (sha256 %s) at %s",
		busyboxVersion, e.Err, busyboxSHA256, e.Path)
}

func (e *busyboxFetchError) Unwrap() error { return e.Err }

// fetchSHA256 GETs url into w, dialling the address directly as the harness's registry
// push does, and returns the sha256 of what it wrote.
func fetchSHA256(ctx context.Context, url string, w io.Writer) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: directTransport()}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(w, h), resp.Body); err != nil {
		return "", fmt.Errorf("GET %s: %w", url, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// makeBusybox unpacks tarball in work, configures (defconfig and busyboxConfig) and builds
// with jobs parallel jobs, logging to logPath, and returns the checked binary's path.
func makeBusybox(ctx context.Context, tarball, work string, jobs int, logPath string) (string, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return "", err
	}
	defer logf.Close()
	src := filepath.Join(work, "busybox-"+busyboxVersion)
	step := func(dir string, name string, args ...string) error {
		fmt.Fprintf(logf, "+ %s %s\n", name, strings.Join(args, " "))
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logf, logf
		cmd.Env = append(os.Environ(), busyboxMakeEnv...)
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("busybox build: %s %s: %v (tail of %s:\n%s)", name, strings.Join(args, " "), err, logPath, logTail(logPath, 30))
		}
		return nil
	}
	if err := step(work, "tar", "-xjf", tarball); err != nil {
		return "", err
	}
	if err := step(src, "make", "defconfig"); err != nil {
		return "", err
	}
	config := filepath.Join(src, ".config")
	b, err := os.ReadFile(config)
	if err != nil {
		return "", err
	}
	if b, err = setBusyboxConfig(b, busyboxConfig); err != nil {
		return "", err
	}
	if err := os.WriteFile(config, b, 0o644); err != nil {
		return "", err
	}
	// oldconfig settles what the changes imply; nothing should be asked (stdin is empty).
	if err := step(src, "make", "oldconfig"); err != nil {
		return "", err
	}
	if b, err = os.ReadFile(config); err != nil {
		return "", err
	}
	if err := checkBusyboxConfig(b, busyboxConfig); err != nil {
		return "", err
	}
	if err := step(src, "make", fmt.Sprintf("-j%d", jobs), "busybox"); err != nil {
		return "", err
	}
	bin := filepath.Join(src, "busybox")
	if err := checkStatic(bin); err != nil {
		return "", err
	}
	return bin, nil
}

// setBusyboxConfig rewrites each option's line of a .config ("CONFIG_X=y" or
// "# CONFIG_X is not set"); an option the file does not have is an error (a renamed one
// would otherwise be silently ignored).
func setBusyboxConfig(config []byte, opts []busyboxOption) ([]byte, error) {
	lines := strings.Split(string(config), "\n")
	for _, o := range opts {
		found := false
		for i, l := range lines {
			if l == "# "+o.Name+" is not set" || strings.HasPrefix(l, o.Name+"=") {
				lines[i] = configLine(o)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("busybox %s's defconfig has no %s", busyboxVersion, o.Name)
		}
	}
	return []byte(strings.Join(lines, "\n")), nil
}

func configLine(o busyboxOption) string {
	if o.Value == "" {
		return "# " + o.Name + " is not set"
	}
	return o.Name + "=" + o.Value
}

// checkBusyboxConfig says which options a .config does not hold as asked.
func checkBusyboxConfig(config []byte, opts []busyboxOption) error {
	lines := strings.Split(string(config), "\n")
	var bad []string
	for _, o := range opts {
		want := configLine(o)
		ok := false
		for _, l := range lines {
			if l == want {
				ok = true
			}
		}
		if !ok {
			bad = append(bad, want)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("busybox .config after oldconfig lacks %s", strings.Join(bad, ", "))
	}
	return nil
}

// checkStatic says whether bin is an ELF program that asks for no loader.
func checkStatic(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("busybox build: %s: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("busybox build: the binary is dynamic (CONFIG_STATIC did not take)")
		}
	}
	return nil
}

// logTail is the last n lines of a log.
func logTail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
