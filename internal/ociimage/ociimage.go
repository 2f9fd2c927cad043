// Package ociimage builds the container image of the socialweb binary without Docker or a
// registry: one layer holding the binary, the CA bundle and the passwd/group entries of the
// non-root user it runs as, nothing else (no shell, no libc), so the binary must be static.
//
// The one decision that shapes it: the image is a pure function of its inputs. Every time
// in it (tar headers, gzip header, the config's created) is the Unix epoch and the files go
// in a fixed order, so the same binary and bundle give the same digest on any machine, and
// a rebuild that changed nothing changes no digest a cluster has pinned.
//
// The image is meant for a read-only root filesystem (readOnlyRootFilesystem: true): it has
// no /tmp and no home directory, and the binary is root-owned, not writable by its user.
package ociimage

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where things are in the image, and who runs it.
const (
	// Name is the image's name when built locally (hack/image.sh).
	Name = "socialweb.computer/socialweb:local"
	// DefaultSource is the org.opencontainers.image.source label when Input.Source is
	// empty: the module path.
	DefaultSource = "socialweb.computer"
	// BinaryPath is the binary, and the image's entrypoint.
	BinaryPath = "/socialweb"
	// CAPath is the CA bundle; SSL_CERT_FILE points at it.
	CAPath = "/etc/ssl/certs/ca-certificates.crt"
	// UID and GID are the user the image runs as: distroless' nonroot.
	UID, GID = 65532, 65532
	// User is the config's user, numeric so that a runtime's runAsNonRoot check can verify
	// it without reading /etc/passwd.
	User = "65532:65532"
)

// Input is what the image is made of.
type Input struct {
	// Binary is the socialweb executable: a static ELF for Arch.
	Binary []byte
	// CABundle is the PEM bundle of trusted CAs (Debian's /etc/ssl/certs/ca-certificates.crt).
	CABundle []byte
	// Version goes in the org.opencontainers.image.version label.
	Version string
	// Arch is the GOARCH the binary is built for: amd64 or arm64.
	Arch string
	// Source is where the source is (the git remote's URL); empty: DefaultSource.
	Source string
}

// Typed refusals of Build; test with errors.Is.
var (
	// ErrNotStatic: the binary needs a dynamic loader or shared libraries the image lacks.
	ErrNotStatic = errors.New("binary is not statically linked")
	// ErrWrongArch: the binary is not an ELF executable of the requested architecture.
	ErrWrongArch = errors.New("binary does not match the architecture")
	// ErrNoCABundle: the CA bundle is empty or holds no PEM certificate.
	ErrNoCABundle = errors.New("CA bundle has no certificate")
)

var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// epoch is every time in the image.
var epoch = time.Unix(0, 0).UTC()

// Build returns the image of in. It refuses a binary that could not run in it (dynamically
// linked, or of another architecture) and a bundle without certificates.
func Build(in Input) (v1.Image, error) {
	if err := check(in); err != nil {
		return nil, err
	}
	layerTar, err := layerTar(in)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: epoch},
			CreatedBy: "socialweb.computer/internal/ociimage",
			Comment:   "socialweb binary, CA certificates, nonroot user",
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	source := in.Source
	if source == "" {
		source = DefaultSource
	}
	cf.Architecture, cf.OS = in.Arch, "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config = v1.Config{
		User:       User,
		Entrypoint: []string{BinaryPath},
		Env:        []string{"SSL_CERT_FILE=" + CAPath},
		WorkingDir: "/",
		Labels: map[string]string{
			"org.opencontainers.image.version": in.Version,
			"org.opencontainers.image.source":  source,
			"org.opencontainers.image.title":   "socialweb",
		},
	}
	return mutate.ConfigFile(img, cf)
}

func check(in Input) error {
	want, ok := machines[in.Arch]
	if !ok {
		return fmt.Errorf("%w: unsupported arch %q (amd64 or arm64)", ErrWrongArch, in.Arch)
	}
	f, err := elf.NewFile(bytes.NewReader(in.Binary))
	if err != nil {
		return fmt.Errorf("%w %s: not an ELF executable: %v", ErrWrongArch, in.Arch, err)
	}
	defer f.Close()
	if f.Machine != want {
		return fmt.Errorf("%w %s: it is built for %s (set GOARCH)", ErrWrongArch, in.Arch, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%w: it asks for a dynamic loader, which the image does not have; build it with CGO_ENABLED=0 (hack/image.sh does)", ErrNotStatic)
		}
	}
	if !bytes.Contains(in.CABundle, []byte("-----BEGIN CERTIFICATE-----")) {
		return fmt.Errorf("%w: %d bytes (Debian's ca-certificates package writes /etc/ssl/certs/ca-certificates.crt)", ErrNoCABundle, len(in.CABundle))
	}
	return nil
}

// Passwd and Group are the image's /etc/passwd and /etc/group: root, and the user it runs
// as, so that tools and libraries that look the user up find a name.
const (
	Passwd = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n"
	Group  = "root:x:0:\nnonroot:x:65532:\n"
)

// layerTar is the layer's uncompressed tar: directories first, every entry root-owned with
// the epoch as its time.
func layerTar(in Input) ([]byte, error) {
	entries := []struct {
		name string
		mode int64
		data []byte
		dir  bool
	}{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: []byte(Group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(Passwd)},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: CAPath[1:], mode: 0o644, data: in.CABundle},
		{name: BinaryPath[1:], mode: 0o755, data: in.Binary},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: epoch, Uname: "root", Gname: "root"}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteLayout writes img as an OCI image-layout tarball (oci-layout, index.json, blobs/)
// naming it name in the index's io.containerd.image.name and
// org.opencontainers.image.ref.name annotations: what `ctr images import` (and so a node's
// image tarball dir), `docker load` and `podman load` read. Deterministic like the image.
func WriteLayout(w io.Writer, img v1.Image, name string) error {
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	mt, err := img.MediaType()
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   mt,
			Size:        int64(len(manifest)),
			Digest:      digest,
			Annotations: map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name},
			Platform:    &v1.Platform{OS: cf.OS, Architecture: cf.Architecture},
		}},
	})
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cfgDigest, err := img.ConfigName()
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	put := func(name string, r io.Reader, size int64) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: epoch}); err != nil {
			return err
		}
		n, err := io.Copy(tw, r)
		if err == nil && n != size {
			err = fmt.Errorf("%s: wrote %d bytes, want %d", name, n, size)
		}
		return err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	layout := []byte(`{"imageLayoutVersion":"1.0.0"}`)
	for _, e := range []struct {
		name string
		b    []byte
	}{{"oci-layout", layout}, {"index.json", index}, {blob(digest), manifest}, {blob(cfgDigest), config}} {
		if err := put(e.name, bytes.NewReader(e.b), int64(len(e.b))); err != nil {
			return err
		}
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		h, err := l.Digest()
		if err != nil {
			return err
		}
		size, err := l.Size()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		err = put(blob(h), rc, size)
		rc.Close()
		if err != nil {
			return err
		}
	}
	return tw.Close()
}
