// Package atomicfile writes a file so that a crash leaves either the old content or the new,
// never half of it: through a temporary file in the same directory, synced, then renamed.
// WriteDurable also syncs the directory, so that the rename itself survives a power loss: for
// a file that must be on disk before the step it announces is taken (a bidder's start intent).
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces path with data, mode perm.
func Write(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// WriteDurable is Write followed by SyncDir of path's directory: once it returns, the new
// content is what a restart reads, even after a power loss.
func WriteDurable(path string, data []byte, perm os.FileMode) error {
	if err := Write(path, data, perm); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir flushes dir's entries (a rename, a create or a remove in it) to disk.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
