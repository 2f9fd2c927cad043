package node

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
)

func TestDiskMiB(t *testing.T) {
	for _, tc := range []struct {
		asked, def, want int
		bad              bool
	}{
		{asked: 0, def: 0, want: DefaultDiskMiB},
		{asked: 0, def: 2048, want: 2048},
		{asked: 512, def: 2048, want: 512},
		{asked: 100, def: 2048, bad: true},
		{asked: 0, def: 100, bad: true},
		{asked: -1, def: 2048, bad: true},
	} {
		got, err := diskMiB(tc.asked, tc.def)
		if (err != nil) != tc.bad || (!tc.bad && got != tc.want) {
			t.Errorf("diskMiB(%d, %d) = %d, %v; want %d (error %v)", tc.asked, tc.def, got, err, tc.want, tc.bad)
		}
	}
}

// diskAgentEnv, set, makes the test binary a node's agent as far as its disk goes: it
// mounts the disk and starts process 1 of the node (TestNodeDiskIsItsOwn).
const diskAgentEnv = "SOCIALWEB_TEST_NODE_DISK_AGENT"

// rootPidFile, in the node's run dir, is process 1's pid as the test agent started it.
const rootPidFile = "root.pid"

// runDiskAgent is the agent's part of a node's disk: mountDisk, then process 1 of the
// node's namespaces (as startRoot, without the network namespace); it waits for process 1.
func runDiskAgent(dir string) int {
	var ns nodeState
	if err := guestproc.ReadJSON(filepath.Join(dir, nodeFile), &ns); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 2
	}
	if err := mountDisk(ns); err != nil {
		os.Stderr.WriteString("mountDisk: " + err.Error() + "\n")
		return 1
	}
	cmd := exec.Command(ns.Binary, "-test.run=^$")
	cmd.Env = append(os.Environ(), rootChildEnv+"="+dir)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	if err := os.WriteFile(filepath.Join(ns.RunDir, rootPidFile), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
		return 1
	}
	_ = cmd.Wait()
	return 0
}

// loopsBacking lists the loop devices whose backing file is img, with their autoclear.
func loopsBacking(t *testing.T, img string) map[string]string {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || strings.TrimSpace(string(b)) != img {
			continue
		}
		ac, _ := os.ReadFile(filepath.Join(filepath.Dir(f), "autoclear"))
		out[strings.Split(f, "/")[3]] = strings.TrimSpace(string(ac))
	}
	return out
}

// mountsUnder lists the host's mount points at or under dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 {
			if mp := unescapeMount(f[4]); mp == dir || strings.HasPrefix(mp, dir+"/") {
				out = append(out, mp)
			}
		}
	}
	return out
}

// TestNodeDiskIsItsOwn: a node's disk is a file system of its size on its work dir, mounted
// in the agent's mount namespace and seen by process 1 of the node: a write past its size
// fails in the node with ENOSPC, the host's view of the work dir stays empty and its mount
// table holds nothing of the disk; once the agent is killed (the node with it), no loop
// device backs the image and the guest dir is removable. mountDisk refuses the host's mount
// namespace. Root only.
func TestNodeDiskIsItsOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if err := Prerequisites(); err != nil {
		t.Skip(err)
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip(err)
	}
	base := t.TempDir()
	dir := filepath.Join(base, "guest")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := makeDisk(dir, minDiskMiB); err != nil {
		t.Fatal(err)
	}
	ns := nodeState{NodeName: "disk-test", Dir: dir, RunDir: filepath.Join("/run/swnode", "d"+strconv.Itoa(os.Getpid())),
		Binary: exe, Contained: true, DiskMiB: minDiskMiB}
	if err := os.MkdirAll(ns.RunDir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(ns.RunDir) })
	if err := guestproc.WriteJSON(filepath.Join(dir, nodeFile), ns); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, diskImage)

	// In the host's mount namespace: refused, nothing mounted.
	if err := mountDisk(ns); !errors.Is(err, ErrHostMountNamespace) {
		t.Fatalf("mountDisk in the host's mount namespace: %v, want refused", err)
	}
	if m := mountsUnder(t, base); len(m) > 0 || len(loopsBacking(t, img)) > 0 {
		t.Fatalf("a refused disk left mounts %v, loop devices %v", m, loopsBacking(t, img))
	}

	// The agent as Boot starts it.
	agent := exec.Command("unshare", "--mount", "--propagation", "slave", "--", exe, "-test.run=^$")
	agent.Env = append(os.Environ(), diskAgentEnv+"="+dir)
	var out strings.Builder
	agent.Stdout, agent.Stderr = &out, &out
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = agent.Wait(); close(exited) }()
	t.Cleanup(func() { _ = agent.Process.Kill(); <-exited })
	var root int
	for t0 := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(ns.RunDir, rootPidFile))
		if _, err := os.Stat(filepath.Join(ns.RunDir, rootReadyFile)); err == nil && len(b) > 0 {
			root, _ = strconv.Atoi(string(b))
			break
		}
		select {
		case <-exited:
			t.Fatalf("the agent ended: %s", out.String())
		default:
		}
		if time.Since(t0) > 15*time.Second {
			t.Fatalf("root not ready: %s", out.String())
		}
	}

	if loops := loopsBacking(t, img); len(loops) != 1 {
		t.Errorf("loop devices backed by the disk: %v, want one", loops)
	} else {
		for dev, ac := range loops {
			if ac != "1" {
				t.Errorf("%s: autoclear %q, want 1", dev, ac)
			}
		}
	}
	if m := mountsUnder(t, base); len(m) > 0 {
		t.Errorf("the host's mount table holds %v", m)
	}
	sh := func(script string) string {
		b, _ := exec.Command("nsenter", "-t", strconv.Itoa(root), "-m", "-p", "--", "/bin/sh", "-c", script).CombinedOutput()
		return strings.TrimSpace(string(b))
	}
	fill := sh("dd if=/dev/zero of=" + ns.work("fill") + " bs=1048576 count=" + strconv.Itoa(2*minDiskMiB) + " 2>&1; echo rc=$?")
	if !strings.Contains(fill, "No space left on device") || strings.Contains(fill, "rc=0") {
		t.Errorf("writing %d MiB in a node of a %d MiB disk: %q, want No space left on device", 2*minDiskMiB, minDiskMiB, fill)
	}
	if got := sh("cat " + img + " | wc -c"); got != "0" {
		t.Errorf("the node reads %s bytes of its disk's image, want it masked", got)
	}
	if entries, _ := os.ReadDir(ns.work()); len(entries) != 0 {
		t.Errorf("the node's writes reached the host's file system beneath its disk: %v", entries)
	}
	var st unix.Stat_t
	if err := unix.Stat(img, &st); err != nil || st.Blocks*512 > (minDiskMiB+1)<<20 {
		t.Errorf("the image takes %d bytes of the host (%v), want at most the disk", st.Blocks*512, err)
	}

	// The agent killed: process 1 dies with it, the namespaces and the mount go, and the
	// loop device clears itself.
	_ = agent.Process.Kill()
	<-exited
	for t0 := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		loops := loopsBacking(t, img)
		if len(loops) == 0 {
			break
		}
		if time.Since(t0) > 10*time.Second {
			t.Fatalf("the node is gone and loop devices %v still back its disk", loops)
		}
	}
	if m := mountsUnder(t, base); len(m) > 0 {
		t.Errorf("the host's mount table holds %v", m)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Errorf("the guest dir of a node that is gone: %v", err)
	}
}

// A disk a node cannot have fails its boot before anything outside its guest dir is made, and
// the failed boot leaves no guest: one below the smallest is refused as the spec's fault, one
// larger than the host has free as the boot's; a --node-disk-mib below the smallest is refused
// by New.
func TestBootRefusesADiskItCannotHave(t *testing.T) {
	if err := Prerequisites(); err != nil {
		t.Skip(err)
	}
	state := t.TempDir()
	if _, err := New(Config{StateDir: state, Binary: "/bin/true", DiskMiB: 100}); !errors.Is(err, substrate.ErrInvalidSpec) {
		t.Errorf("New with a 100 MiB node disk: %v, want ErrInvalidSpec", err)
	}
	s, err := New(Config{StateDir: state, Binary: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	free, err := freeMiB(state)
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string][]byte{SecretKubeconfig: []byte("x"), SecretCA: []byte("y")}
	join := []byte(`{"server":"https://127.0.0.1:6443","nodeName":"n"}`)
	for _, tc := range []struct {
		mib  int
		want error
		says string
	}{
		{mib: minDiskMiB - 1, want: substrate.ErrInvalidSpec, says: "at least"},
		{mib: int(free) + 1024, want: substrate.ErrBoot, says: "MiB free"},
	} {
		_, err := s.Boot(context.Background(), substrate.GuestSpec{ID: "a", UserData: join, Secrets: secrets, DiskMiB: tc.mib})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("a %d MiB disk: %v, want %v saying %q", tc.mib, err, tc.want, tc.says)
		}
		if _, err := s.Status(context.Background(), "a"); !errors.Is(err, substrate.ErrNotFound) {
			t.Errorf("a %d MiB disk left a guest: %v", tc.mib, err)
		}
		if _, err := os.Stat(filepath.Join(state, "a")); !os.IsNotExist(err) {
			t.Errorf("a %d MiB disk left its guest dir: %v", tc.mib, err)
		}
	}
}
