package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// fakeELF is the smallest ELF executable debug/elf reads: a header and, when interp is set,
// a PT_INTERP program header (what a dynamically linked binary has).
func fakeELF(t *testing.T, m elf.Machine, interp bool) []byte {
	t.Helper()
	var progs []elf.Prog64
	progs = append(progs, elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X)})
	if interp {
		progs = append(progs, elf.Prog64{Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R)})
	}
	h := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(m), Version: uint32(elf.EV_CURRENT),
		Phoff: 64, Ehsize: 64, Phentsize: 56, Phnum: uint16(len(progs)),
	}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	var b bytes.Buffer
	if err := binary.Write(&b, binary.LittleEndian, h); err != nil {
		t.Fatal(err)
	}
	if err := binary.Write(&b, binary.LittleEndian, progs); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

const testCA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

func input(t *testing.T) Input {
	return Input{Binary: fakeELF(t, elf.EM_X86_64, false), CABundle: []byte(testCA), Version: "v1.2.3", Arch: "amd64", Source: "https://example.org/socialweb"}
}

// layerFiles is every entry of the image's one layer: name to header and content.
func layerFiles(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v; want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	hs, data := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		hs[h.Name], data[h.Name] = h, b
	}
	return hs, data
}

func TestBuildConfig(t *testing.T) {
	in := input(t)
	img, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	for _, row := range []struct{ what, got, want string }{
		{"user", c.User, "65532:65532"},
		{"entrypoint", strings.Join(c.Entrypoint, " "), "/socialweb"},
		{"cmd", strings.Join(c.Cmd, " "), ""},
		{"env", strings.Join(c.Env, " "), "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		{"os", cf.OS, "linux"},
		{"architecture", cf.Architecture, "amd64"},
		{"created", cf.Created.UTC().String(), "1970-01-01 00:00:00 +0000 UTC"},
		{"version label", c.Labels["org.opencontainers.image.version"], "v1.2.3"},
		{"source label", c.Labels["org.opencontainers.image.source"], "https://example.org/socialweb"},
	} {
		if row.got != row.want {
			t.Errorf("%s: %q, want %q", row.what, row.got, row.want)
		}
	}
	// The user is numeric and not root, so a runtime can check runAsNonRoot from the config.
	if strings.HasPrefix(c.User, "0") || strings.ContainsAny(c.User, "abcdefghijklmnopqrstuvwxyz") {
		t.Errorf("user %q is root or not numeric", c.User)
	}
	mt, _ := img.MediaType()
	if mt != "application/vnd.oci.image.manifest.v1+json" {
		t.Errorf("manifest media type %s", mt)
	}
	in.Source = ""
	img, _ = Build(in)
	if cf, _ := img.ConfigFile(); cf.Config.Labels["org.opencontainers.image.source"] != DefaultSource {
		t.Errorf("default source label %q", cf.Config.Labels["org.opencontainers.image.source"])
	}
}

func TestBuildHoldsExactlyTheBinaryCAsAndUsers(t *testing.T) {
	in := input(t)
	img, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	hs, data := layerFiles(t, img)
	want := map[string]struct {
		typ  byte
		mode int64
		data string
	}{
		"etc/":                              {tar.TypeDir, 0o755, ""},
		"etc/ssl/":                          {tar.TypeDir, 0o755, ""},
		"etc/ssl/certs/":                    {tar.TypeDir, 0o755, ""},
		"etc/ssl/certs/ca-certificates.crt": {tar.TypeReg, 0o644, testCA},
		"etc/passwd":                        {tar.TypeReg, 0o644, Passwd},
		"etc/group":                         {tar.TypeReg, 0o644, Group},
		"socialweb":                         {tar.TypeReg, 0o755, string(in.Binary)},
	}
	for name, w := range want {
		h := hs[name]
		if h == nil {
			t.Errorf("%s is missing", name)
			continue
		}
		if h.Typeflag != w.typ || h.Mode != w.mode || string(data[name]) != w.data {
			t.Errorf("%s: type %c mode %o, %d bytes; want type %c mode %o, %d bytes", name, h.Typeflag, h.Mode, len(data[name]), w.typ, w.mode, len(w.data))
		}
		// Root-owned, so the user the image runs as cannot change the binary or the CAs.
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(epoch) {
			t.Errorf("%s: owner %d:%d time %s; want 0:0 at the epoch", name, h.Uid, h.Gid, h.ModTime)
		}
	}
	for name := range hs {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected entry %s", name)
		}
	}
	if !strings.Contains(Passwd, "nonroot:x:65532:65532:") || !strings.Contains(Group, "nonroot:x:65532:") {
		t.Errorf("passwd/group lack the nonroot user:\n%s%s", Passwd, Group)
	}
}

func TestBuildIsReproducible(t *testing.T) {
	a, err := Build(input(t))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Build(input(t))
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Errorf("two builds of the same inputs: %s and %s", da, db)
	}
	in := input(t)
	in.Version = "v1.2.4"
	c, _ := Build(in)
	if dc, _ := c.Digest(); dc == da {
		t.Error("another version gave the same digest")
	}
	var wa, wb bytes.Buffer
	if err := WriteLayout(&wa, a, Name); err != nil {
		t.Fatal(err)
	}
	if err := WriteLayout(&wb, b, Name); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(wa.Bytes(), wb.Bytes()) {
		t.Error("two tarballs of the same image differ")
	}
}

func TestBuildRefuses(t *testing.T) {
	rows := []struct {
		name   string
		change func(*Input)
		want   error
	}{
		{"dynamically linked", func(in *Input) { in.Binary = fakeELF(t, elf.EM_X86_64, true) }, ErrNotStatic},
		{"other architecture", func(in *Input) { in.Binary = fakeELF(t, elf.EM_AARCH64, false) }, ErrWrongArch},
		{"arm64 binary for arm64", func(in *Input) { in.Binary, in.Arch = fakeELF(t, elf.EM_AARCH64, false), "arm64" }, nil},
		{"unsupported arch", func(in *Input) { in.Arch = "386" }, ErrWrongArch},
		{"not an ELF", func(in *Input) { in.Binary = []byte("#!/bin/sh\necho hi\n") }, ErrWrongArch},
		{"empty binary", func(in *Input) { in.Binary = nil }, ErrWrongArch},
		{"empty CA bundle", func(in *Input) { in.CABundle = nil }, ErrNoCABundle},
		{"CA bundle without certificates", func(in *Input) { in.CABundle = []byte("# nothing\n") }, ErrNoCABundle},
	}
	for _, row := range rows {
		in := input(t)
		row.change(&in)
		_, err := Build(in)
		if !errors.Is(err, row.want) || (row.want == nil) != (err == nil) {
			t.Errorf("%s: %v, want %v", row.name, err, row.want)
		}
	}
}

// The tarball is an OCI image layout that go-containerregistry's own reader takes back to
// the same image, and that names it for containerd's import.
func TestWriteLayoutReadsBack(t *testing.T) {
	img, err := Build(input(t))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteLayout(&buf, img, Name); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tr := tar.NewReader(&buf)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, b := range files {
		if hexd, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			if s := sha256.Sum256(b); hex.EncodeToString(s[:]) != hexd {
				t.Errorf("blob %s holds content of another digest", name)
			}
		}
	}
	var index v1.IndexManifest
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, files["index.json"])
	}
	if a := index.Manifests[0].Annotations; a["io.containerd.image.name"] != Name || a["org.opencontainers.image.ref.name"] != Name {
		t.Errorf("index annotations %v", a)
	}
	ii, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	got, err := ii.Image(want)
	if err != nil {
		t.Fatalf("image %s from the layout: %v", want, err)
	}
	if _, data := layerFiles(t, got); !bytes.Equal(data["socialweb"], input(t).Binary) {
		t.Error("the layout's image lacks the binary")
	}
}
