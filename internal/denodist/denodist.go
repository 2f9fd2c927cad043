// Package denodist provisions the Deno that deno guests run: the version this module pins
// (npm/package.json and its lockfile, the same files hack/install-deno.sh installs with npm),
// taken from the npm registry's platform package (@deno/linux-x64-glibc and the like),
// checked against the lockfile's sha512 integrity before a byte of it is unpacked, and kept
// in the user's cache dir, where it is found from any working directory.
//
// The package is read from npm's own cache when npm has fetched it before (npm ci, npm
// install), so a machine that ran the installer needs no download; otherwise from the
// registry npm would use ($npm_config_registry, the registry line of ~/.npmrc, else
// registry.npmjs.org). Nothing here runs npm or node.
package denodist

import (
	"embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

//go:embed npm/package.json npm/package-lock.json
var npmFiles embed.FS

// Pin is the platform package of the pinned Deno.
type Pin struct {
	// Version is Deno's version, e.g. "2.9.6".
	Version string
	// Package is the npm package that carries the binary, e.g. "@deno/linux-x64-glibc".
	Package string
	// Integrity is the lockfile's Subresource Integrity of the package tarball
	// ("sha512-<base64>").
	Integrity string
}

// platformPackages maps GOARCH to Deno's Linux glibc platform package.
var platformPackages = map[string]string{
	"amd64": "@deno/linux-x64-glibc",
	"arm64": "@deno/linux-arm64-glibc",
}

// Pinned is the pinned Deno for this machine's architecture.
func Pinned() (Pin, error) { return pinnedFor(runtime.GOOS, runtime.GOARCH) }

func pinnedFor(goos, goarch string) (Pin, error) {
	pkg, ok := platformPackages[goarch]
	if goos != "linux" || !ok {
		return Pin{}, &UnsupportedError{Platform: goos + "/" + goarch}
	}
	b, err := npmFiles.ReadFile("npm/package-lock.json")
	if err != nil {
		return Pin{}, err
	}
	return pinFromLock(b, pkg)
}

// pinFromLock reads pkg's entry, and the deno version it must match, from a package-lock.json
// of lockfileVersion 2 or 3.
func pinFromLock(lock []byte, pkg string) (Pin, error) {
	var l struct {
		LockfileVersion int `json:"lockfileVersion"`
		Packages        map[string]struct {
			Version   string `json:"version"`
			Integrity string `json:"integrity"`
		} `json:"packages"`
	}
	if err := json.Unmarshal(lock, &l); err != nil {
		return Pin{}, fmt.Errorf("denodist: the pinned lockfile: %w", err)
	}
	if l.LockfileVersion < 2 {
		return Pin{}, fmt.Errorf("denodist: the pinned lockfile has lockfileVersion %d, want 2 or 3", l.LockfileVersion)
	}
	deno, ok := l.Packages["node_modules/deno"]
	if !ok || deno.Version == "" {
		return Pin{}, fmt.Errorf("denodist: the pinned lockfile has no node_modules/deno")
	}
	p, ok := l.Packages["node_modules/"+pkg]
	if !ok {
		return Pin{}, fmt.Errorf("denodist: the pinned lockfile has no node_modules/%s", pkg)
	}
	if p.Version != deno.Version {
		return Pin{}, fmt.Errorf("denodist: the pinned lockfile has %s %s but deno %s", pkg, p.Version, deno.Version)
	}
	if !strings.HasPrefix(p.Integrity, "sha512-") {
		return Pin{}, fmt.Errorf("denodist: %s in the pinned lockfile has integrity %q, want sha512-", pkg, p.Integrity)
	}
	return Pin{Version: p.Version, Package: pkg, Integrity: p.Integrity}, nil
}

// TarballPath is the package tarball's path below a registry URL, as npm's registry lays it
// out: @scope/name/-/name-VERSION.tgz.
func (p Pin) TarballPath() string {
	base := p.Package[strings.LastIndex(p.Package, "/")+1:]
	return p.Package + "/-/" + base + "-" + p.Version + ".tgz"
}

// String is e.g. "deno 2.9.6 (@deno/linux-x64-glibc)".
func (p Pin) String() string { return "deno " + p.Version + " (" + p.Package + ")" }

// Dir is where the pinned Deno is kept: <user cache dir>/socialweb/deno/VERSION-PLATFORM
// ($XDG_CACHE_HOME, else ~/.cache). "" when the user has no cache dir (no $HOME).
func (p Pin) Dir() string {
	c, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(c, "socialweb", "deno", p.Version+"-"+strings.TrimPrefix(p.Package, "@deno/"))
}

// BinaryName is the file name of the binary in Dir.
const BinaryName = "deno"

// Installed is the pinned Deno's binary in dir when it was installed there, else "".
// Only Install writes it, by rename after the integrity check, so its presence is enough.
func Installed(dir string) string {
	if dir == "" {
		return ""
	}
	p := filepath.Join(dir, BinaryName)
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return p
	}
	return ""
}

// InstalledBinary is the pinned Deno in the user's cache dir, when it is there; "" otherwise.
func InstalledBinary() string {
	p, err := Pinned()
	if err != nil {
		return ""
	}
	return Installed(p.Dir())
}
