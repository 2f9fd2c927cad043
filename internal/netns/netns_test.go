package netns

import (
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// threadNetns is the inode of the network namespace of the calling goroutine's thread.
func threadNetns(t *testing.T) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestDoRunsInTheNamespaceAndComesBack(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a network namespace")
	}
	name := "swnetnstest"
	_ = exec.Command("ip", "netns", "del", name).Run()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	path := "/var/run/netns/" + name

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := threadNetns(t)
	var inside uint64
	var ifaces []net.Interface
	if err := Do(path, func() (err error) {
		inside = threadNetns(t)
		ifaces, err = net.Interfaces()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if inside == before {
		t.Fatal("fn ran in the caller's network namespace")
	}
	if len(ifaces) != 1 || ifaces[0].Name != "lo" {
		t.Errorf("interfaces inside a new namespace: %v, want lo alone", ifaces)
	}
	if after := threadNetns(t); after != before {
		t.Errorf("the caller's thread moved from namespace %d to %d", before, after)
	}
	// fn's error comes back as it is.
	if err := Do(path, func() error { return os.ErrDeadlineExceeded }); err != os.ErrDeadlineExceeded {
		t.Errorf("fn's error: got %v", err)
	}
}

func TestDoRefusesAMissingNamespace(t *testing.T) {
	ran := false
	if err := Do("/nonexistent/ns/net", func() error { ran = true; return nil }); err == nil || ran {
		t.Fatalf("a missing namespace: err %v, fn ran %v", err, ran)
	}
}
