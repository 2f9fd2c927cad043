package node

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"socialweb.computer/internal/atomicfile"
)

// Images a node runs without a registry. No registry is reachable from a bidder host, so
// every image a node runs is imported into its containerd at boot from OCI image-layout
// tarballs: the substrate's own sandbox image, and every *.tar of Config.ImageDir.
const (
	// PauseImage is the sandbox (pause) image each pod's network namespace is held by.
	PauseImage = "socialweb.computer/pause:local"
	// BusyboxImage is the small test image WriteBusyboxImage builds.
	BusyboxImage = "socialweb.computer/busybox:local"
)

// BusyboxStatic is where Debian's busybox-static puts its binary.
const BusyboxStatic = "/bin/busybox"

// ImageFile is one regular file of a single-layer image.
type ImageFile struct {
	Path string // inside the image, without a leading slash: "bin/busybox"
	Mode int64
	Data []byte
}

// WriteOCIImage writes an OCI image-layout tarball (oci-layout, index.json, blobs) holding
// one linux/amd64 image named name (annotations io.containerd.image.name and
// org.opencontainers.image.ref.name, so `ctr images import` and the containerd import API
// keep the name) with one layer of files and symlinks, and the given entrypoint and command.
func WriteOCIImage(path, name string, files []ImageFile, links map[string]string, entrypoint, cmd []string) error {
	// The layer: a gzip'd tar with fixed times, so the same inputs make the same digests.
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	addDirs := func(p string) {
		for d := filepath.Dir(p); d != "." && d != "/" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	var all []string
	for _, f := range files {
		all = append(all, f.Path)
	}
	for l := range links {
		all = append(all, l)
	}
	for _, p := range all {
		addDirs(p)
	}
	for _, d := range sortedKeys(dirs) {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.Path, Mode: f.Mode, Size: int64(len(f.Data)), ModTime: epoch}); err != nil {
			return err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return err
		}
	}
	for _, l := range sortedKeys(links) {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: l, Linkname: links[l], Mode: 0o777, ModTime: epoch}); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	diffID := sha256.Sum256(layerTar.Bytes())
	var layerGz bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&layerGz, gzip.BestSpeed)
	gz.ModTime = epoch
	if _, err := gz.Write(layerTar.Bytes()); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}

	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Entrypoint": entrypoint,
			"Cmd":        cmd,
			"Env":        []string{"PATH=/bin"},
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(diffID[:])}},
	})
	type desc struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int               `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
		Platform    map[string]string `json:"platform,omitempty"`
	}
	digest := func(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        desc{MediaType: "application/vnd.oci.image.config.v1+json", Digest: digest(config), Size: len(config)},
		"layers":        []desc{{MediaType: "application/vnd.oci.image.layer.v1.tar+gzip", Digest: digest(layerGz.Bytes()), Size: layerGz.Len()}},
	})
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []desc{{
			MediaType: "application/vnd.oci.image.manifest.v1+json", Digest: digest(manifest), Size: len(manifest),
			Annotations: map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name},
			Platform:    map[string]string{"architecture": "amd64", "os": "linux"},
		}},
	})

	var out bytes.Buffer
	ow := tar.NewWriter(&out)
	put := func(name string, b []byte) error {
		if err := ow.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := ow.Write(b)
		return err
	}
	blob := func(b []byte) string { return "blobs/sha256/" + digest(b)[len("sha256:"):] }
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := ow.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	for _, e := range []struct {
		name string
		b    []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blob(manifest), manifest},
		{blob(config), config},
		{blob(layerGz.Bytes()), layerGz.Bytes()},
	} {
		if err := put(e.name, e.b); err != nil {
			return err
		}
	}
	if err := ow.Close(); err != nil {
		return err
	}
	return atomicfile.Write(path, out.Bytes(), 0o644)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	// Parents sort before their children.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// busyboxFiles is busybox-static as /bin/busybox with /bin/sh and /bin/sleep links.
func busyboxFiles() ([]ImageFile, map[string]string, error) {
	b, err := os.ReadFile(BusyboxStatic)
	if err != nil {
		return nil, nil, fmt.Errorf("%s (Debian busybox-static; hack/install-guest-deps.sh installs it): %w", BusyboxStatic, err)
	}
	links := map[string]string{}
	for _, a := range []string{"sh", "sleep", "echo", "cat", "ls", "env", "true", "false", "wget", "hostname"} {
		links["bin/"+a] = "busybox"
	}
	return []ImageFile{{Path: "bin/busybox", Mode: 0o755, Data: b}}, links, nil
}

// WritePauseImage writes the sandbox image: busybox-static sleeping for ever as the
// sandbox's process 1 (it only holds the pod's namespaces; containerd stops a sandbox with
// SIGKILL).
func WritePauseImage(path string) error {
	files, links, err := busyboxFiles()
	if err != nil {
		return err
	}
	return WriteOCIImage(path, PauseImage, files, links, []string{"/bin/busybox", "sleep", "2147483647"}, nil)
}

// WriteBusyboxImage writes BusyboxImage: busybox-static with sh and a few applets linked,
// entrypoint /bin/sh.
func WriteBusyboxImage(path string) error {
	files, links, err := busyboxFiles()
	if err != nil {
		return err
	}
	return WriteOCIImage(path, BusyboxImage, files, links, nil, []string{"/bin/sh"})
}
