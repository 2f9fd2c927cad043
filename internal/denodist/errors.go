package denodist

import "fmt"

// UnsupportedError: Deno publishes no Linux glibc package for this platform.
type UnsupportedError struct{ Platform string }

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("denodist: no pinned Deno for %s (linux/amd64 and linux/arm64 only); install deno and pass SOCIALWEB_DENO=PATH", e.Platform)
}

// IntegrityError: the bytes of the package are not the ones the lockfile pins. Nothing of
// them was unpacked.
type IntegrityError struct {
	// From is where the bytes came from: a registry URL or a path in npm's cache.
	From      string
	Want, Got string
}

func (e *IntegrityError) Error() string {
	return fmt.Sprintf("denodist: %s is not the pinned package: integrity %s, want %s (a registry or cache serving other bytes; nothing was installed)", e.From, e.Got, e.Want)
}

// FetchError: the registry could not be reached or did not serve the package.
type FetchError struct {
	URL    string
	Reason string
}

func (e *FetchError) Error() string {
	return fmt.Sprintf("denodist: fetching %s: %s (set npm_config_registry to a reachable npm registry, or SOCIALWEB_DENO=PATH to a deno binary)", e.URL, e.Reason)
}

// PackageError: the tarball passed the integrity check but is not a Deno platform package
// (no package/deno, or a binary that does not report the pinned version).
type PackageError struct {
	From   string
	Reason string
}

func (e *PackageError) Error() string {
	return fmt.Sprintf("denodist: %s: %s", e.From, e.Reason)
}
