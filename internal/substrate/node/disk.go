package node

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"socialweb.computer/internal/diskspace"
)

// A namespace node's disk. Everything a node writes (containerd's images and snapshots, the
// kubelet's dirs with every emptyDir, the local-path volumes, pod logs) is under its work
// dir, and the work dir is a file system of its own: an ext4 image in the guest dir of the
// node's disk size. A tenant who fills it fills their node, not the host, and the kubelet
// sees that size as the node's ephemeral-storage capacity and evicts by it. The image is
// sparse: the host's free space is checked at boot (it must hold the whole disk then), not
// reserved, so nodes booted later may overcommit what is left.
//
// The disk is mounted in the agent's own mount namespace, never the host's: the agent runs
// under `unshare --mount --propagation slave` (Boot), mounts the disk on the work dir
// before anything is written there, and process 1 of the node copies that namespace and
// binds the work dir into the node's root (buildRoot). The agent reads and writes the work
// dir itself (configs, the kubelet's certificates), so the node's own namespace alone would
// not do. The loop device is set to clear itself: when the agent and the node's last
// process are gone, however they ended, the namespaces go, the mount with them, and the
// loop device with the mount. The host's mount table never holds the disk, so a node kept
// running across restarts does not keep the guest dir (or a test's temporary dir) busy,
// and the guest dir is removable once the node is stopped. From the host the work dir is
// seen through the agent: /proc/AGENT_PID/root/GUEST_DIR/work.

// diskImage is the node's disk in its guest dir; gone with the node.
const diskImage = "disk.img"

// DefaultDiskMiB is a node's disk when its contract names none.
const DefaultDiskMiB = 10 << 10

// minDiskMiB is the smallest node disk: the images a node imports (pause, busybox) and
// the kubelet's eviction margins must fit.
const minDiskMiB = 256

// diskMiB is the disk of a node whose contract asks for asked MiB (0: def, 0: DefaultDiskMiB).
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
	r, err := diskspace.Of(path)
	if err != nil {
		return 0, err
	}
	return int64(r.Free >> 20), nil
}

// makeDisk makes the node's disk in dir: a sparse file of mib MiB holding an empty ext4.
// The host must have mib free. Nothing is mounted (mountDisk, in the agent).
func makeDisk(dir string, mib int) error {
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
	return nil
}

// ErrHostMountNamespace is mountDisk's refusal in the host's mount namespace: the disk
// would stay mounted on the host for as long as the host runs.
var ErrHostMountNamespace = errors.New("the node's disk would be mounted in the host's mount namespace (the agent runs under unshare --mount)")

// mountDisk mounts the node's disk (in its guest dir) on its work dir, nosuid and nodev,
// through a loop device that clears itself once the mount is gone. It runs in the agent,
// in a mount namespace of its own, before anything is written to the work dir.
func mountDisk(ns nodeState) error {
	// The agent's parent (guestproc's supervisor, or a test) is in the host's namespace;
	// unshare(1) exec'd the agent in a new one.
	self, err := os.Stat("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	if parent, err := os.Stat(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid())); err != nil || os.SameFile(self, parent) {
		return ErrHostMountNamespace
	}
	// Whatever started the agent, nothing it mounts reaches the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / a slave mount: %w", err)
	}
	work := ns.work()
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	dev, err := attachLoop(filepath.Join(ns.Dir, diskImage))
	if err != nil {
		return fmt.Errorf("the node's disk: %w", err)
	}
	// Closed once mounted: from then on the mount alone holds the loop device, and its
	// autoclear detaches the device when the mount goes.
	defer dev.Close()
	if err := unix.Mount(dev.Name(), work, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mount the node's disk %s on %s: %w", dev.Name(), work, err)
	}
	return os.Chmod(work, 0o700)
}

// attachLoop binds a free loop device to the image, read-write, with LO_FLAGS_AUTOCLEAR:
// the device detaches on its last close. The caller holds the returned device open until
// something else (a mount) holds it.
func attachLoop(img string) (*os.File, error) {
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	info := unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}
	copy(info.File_name[:len(info.File_name)-1], img)
	// Another process may take the free device between asking and binding (EBUSY).
	for attempt := 0; attempt < 16; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("a free loop device: %w", err)
		}
		dev, err := os.OpenFile(fmt.Sprintf("/dev/loop%d", n), os.O_RDWR, 0)
		if err != nil {
			return nil, err
		}
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &unix.LoopConfig{Fd: uint32(f.Fd()), Info: info})
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
			// A kernel before 5.8: no LOOP_CONFIGURE.
			if err = unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_FD, int(f.Fd())); err == nil {
				if err = unix.IoctlLoopSetStatus64(int(dev.Fd()), &info); err != nil {
					_ = unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_CLR_FD, 0)
				}
			}
		}
		if errors.Is(err, unix.EBUSY) {
			dev.Close()
			continue
		}
		if err != nil {
			dev.Close()
			return nil, fmt.Errorf("bind %s to %s: %w", dev.Name(), img, err)
		}
		return dev, nil
	}
	return nil, errors.New("no free loop device after 16 attempts")
}
