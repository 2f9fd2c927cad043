package node

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
)

// Registries: the node's containerd pulls through the CRI (the kubelet asks; a pod's
// imagePullSecrets reach containerd with the request), and finds each registry's hosts,
// mirrors, CA and credentials in its hosts directory (config_path), which the bidder's
// operator writes once (Config.RegistryConfigDir) and the agent copies into the node: the
// node's own root cannot see the host's files.

// registryDir is the node's copy, containerd's config_path.
func (ns nodeState) registryDir() string { return ns.work("containerd", "certs.d") }

// registryHostDir matches a hosts directory's entries: a registry host with an optional port
// ("docker.io", "203.0.113.5:5000") or "_default".
var registryHostDir = regexp.MustCompile(`^([a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?|_default)$`)

// maxRegistryFile bounds one file of the registry configuration (hosts.toml, a CA).
const maxRegistryFile = 1 << 20

// copyRegistryConfig copies src (a hosts directory: HOST/FILE, regular files only) into
// dst. Anything else in src (a nested directory, a link, a name no registry has) is an
// error naming it, so a mistake in the operator's configuration is seen at the first boot.
func copyRegistryConfig(src, dst string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	if src == "" {
		return nil
	}
	hosts, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("registry configuration %s: %w", src, err)
	}
	for _, h := range hosts {
		if !h.IsDir() || !registryHostDir.MatchString(h.Name()) {
			return fmt.Errorf("registry configuration %s: %q is not a registry host directory (want HOST[:PORT]/hosts.toml or _default/hosts.toml)", src, h.Name())
		}
		files, err := os.ReadDir(filepath.Join(src, h.Name()))
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(dst, h.Name()), 0o700); err != nil {
			return err
		}
		for _, f := range files {
			from := filepath.Join(src, h.Name(), f.Name())
			if !f.Type().IsRegular() {
				return fmt.Errorf("registry configuration: %s is not a regular file", from)
			}
			if err := copyFile(from, filepath.Join(dst, h.Name(), f.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(out, io.LimitReader(in, maxRegistryFile+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > maxRegistryFile {
		err = fmt.Errorf("%s is larger than %d bytes", from, maxRegistryFile)
	}
	return err
}
