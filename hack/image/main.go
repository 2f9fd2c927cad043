// Command image writes the OCI image of a socialweb binary (internal/ociimage) as an OCI
// image-layout tarball named socialweb.computer/socialweb:local, for `ctr images import`, a
// node bidder's image tarball dir, `docker load` or `podman load`. hack/image.sh builds the
// static binary and runs it.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"socialweb.computer/internal/atomicfile"
	"socialweb.computer/internal/ociimage"
)

func main() {
	binary := flag.String("binary", "bin/image/socialweb", "the static socialweb binary (CGO_ENABLED=0)")
	ca := flag.String("ca", "/etc/ssl/certs/ca-certificates.crt", "the PEM bundle of trusted CAs")
	version := flag.String("version", "dev", "the org.opencontainers.image.version label")
	source := flag.String("source", "", "the org.opencontainers.image.source label (empty: "+ociimage.DefaultSource+")")
	arch := flag.String("arch", runtime.GOARCH, "the GOARCH the binary is built for")
	name := flag.String("name", ociimage.Name, "the image's name in the tarball")
	out := flag.String("out", "bin/socialweb-image.tar", "the tarball to write")
	flag.Parse()
	if err := run(*binary, *ca, *version, *source, *arch, *name, *out); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(binary, ca, version, source, arch, name, out string) error {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	bundle, err := os.ReadFile(ca)
	if err != nil {
		return fmt.Errorf("%w (Debian's ca-certificates package writes it)", err)
	}
	img, err := ociimage.Build(ociimage.Input{Binary: bin, CABundle: bundle, Version: version, Arch: arch, Source: source})
	if err != nil {
		return fmt.Errorf("%s: %w", binary, err)
	}
	var buf bytes.Buffer
	if err := ociimage.WriteLayout(&buf, img, name); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := atomicfile.Write(out, buf.Bytes(), 0o644); err != nil {
		return err
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s: %s %s linux/%s, %d MB\n", out, name, d, arch, buf.Len()>>20)
	return nil
}
