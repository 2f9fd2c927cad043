package node

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// A namespace node's disk. Everything a node writes (containerd's images and snapshots, the
// kubelet's dirs with every emptyDir, the local-path volumes, pod logs) is under its work
// dir, and the work dir is a file system of its own: an ext4 image in the guest dir of the
// node's disk size, loop-mounted on work. A tenant who fills it fills their node, not the
// host, and the kubelet sees that size as the node's ephemeral-storage capacity and evicts
// by it. The image is sparse: the host's free space is checked at boot (it must hold the
// whole disk then), not reserved, so nodes booted later may overcommit what is left.

// diskImage is the node's disk in its guest dir; gone with the node.
const diskImage = "disk.img"

// DefaultDiskMiB is a node's disk when its contract names none.
const DefaultDiskMiB = 10 << 10

// minDiskMiB is the smallest node disk: the images a node imports (pause, busybox) and
// the kubelet's eviction margins must fit.
const minDiskMiB = 256

// diskMiB is the disk of a node whose contract asks for asked MiB (0: def).
func diskMiB(asked, def int) (int, error) {
	if asked == 0 {
		asked = def
	}
	if asked == 0 {
		asked = DefaultDiskMiB
	}
	if asked < minDiskMiB {
		return 0, fmt.Errorf("disk %d MiB: a node needs at least %d MiB", asked, minDiskMiB)
	}
	return asked, nil
}

// freeMiB is what the file system holding path has free for an unprivileged writer.
func freeMiB(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize) >> 20, nil
}

// makeDisk makes the node's disk in dir (mib MiB, sparse, ext4) and mounts it on work,
// nosuid and nodev. The host must have mib free.
func makeDisk(dir, work string, mib int) error {
	free, err := freeMiB(dir)
	if err != nil {
		return err
	}
	if free < int64(mib) {
		return fmt.Errorf("the node's disk is %d MiB and the host has %d MiB free in %s", mib, free, dir)
	}
	img := filepath.Join(dir, diskImage)
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(mib) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// No reserved blocks (the node's root is the tenant's); the inode tables and journal
	// are initialised lazily, so a large disk is made in a fraction of a second.
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", img).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	if out, err := exec.Command("mount", "-o", "loop,nosuid,nodev", img, work).CombinedOutput(); err != nil {
		return fmt.Errorf("mount the node's disk: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return os.Chmod(work, 0o700)
}
