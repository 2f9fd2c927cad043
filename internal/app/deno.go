package app

import (
	"context"

	"socialweb.computer/internal/denodist"
	"socialweb.computer/internal/substrate/deno"
)

// EnsureDeno gives deno guests their binary: the one deno.DefaultBinary finds
// ($SOCIALWEB_DENO, the project's .cache/deno, the user's cache, PATH), else the pinned Deno
// fetched now into the user's cache (denodist: npm's cache, else the registry; integrity
// checked), with a progress line. It returns the binary, or "" and the reason none is there:
// up then runs without deno guests, and says so.
func EnsureDeno(ctx context.Context, phase func(string, ...any)) (string, error) {
	if p := deno.DefaultBinary(); p != "" {
		return p, nil
	}
	pin, err := denodist.Pinned()
	if err != nil {
		return "", err
	}
	src := denodist.DefaultSource()
	phase("fetching %s into %s (npm cache %s, else %s)", pin, pin.Dir(), or(src.NPMCache, "none"), src.Registry)
	r, err := denodist.Install(ctx, pin, "", src, denodist.LineProgress(pin, phase))
	if err != nil {
		return "", err
	}
	phase("%s installed at %s (from %s; integrity %s checked)", pin, r.Binary, r.From, pin.Integrity)
	return r.Binary, nil
}
