package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/substrate/vm/vmtest"
)

// testImage is the image the tests boot (vmtest.Image).
func testImage(t *testing.T) string {
	t.Helper()
	return vmtest.Image(t, filepath.Join("..", "..", ".."))
}

func newSub(t *testing.T) (*Substrate, string) {
	t.Helper()
	img := testImage(t)
	dir := t.TempDir()
	s, err := New(Config{StateDir: dir, ImageDir: img, Accelerator: os.Getenv("SOCIALWEB_VM_ACCEL")})
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, s, dir)
	return s, dir
}

// bootTimeout is generous: under TCG on a 2-core host shared with builds a
// boot has taken 15-20 s.
const bootTimeout = 120 * time.Second

func TestBootUserDataPortStopAndRestart(t *testing.T) {
	s, dir := newSub(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*bootTimeout)
	defer cancel()
	userData := `
echo "userdata: hello from $SOCIALWEB_GUEST_ID"
mkdir -p /www && echo "hello from the vm" >/www/index.html
httpd -p "$SOCIALWEB_PORT_HTTP" -h /www
echo "userdata: httpd on $SOCIALWEB_PORT_HTTP"
while :; do sleep 3600; done
`
	t0 := time.Now()
	st, err := s.Boot(ctx, substrate.GuestSpec{ID: "web", UserData: []byte(userData),
		Ports: []substrate.Port{{Name: "http", Guest: 8080}}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Accelerator != KVM && st.Accelerator != TCG {
		t.Fatalf("accelerator %q", st.Accelerator)
	}
	st, err = substrate.WaitRunning(ctx, s, "web")
	if err != nil || st.Phase != substrate.Running {
		logs, _ := s.Logs(ctx, "web", 30)
		t.Fatalf("%+v %v\n%s", st, err, logs)
	}
	t.Logf("boot to %q: %s (accelerator %s: %s)", MarkerStarted, time.Since(t0).Round(time.Millisecond), st.Accelerator, s.AcceleratorReason(ctx))
	if os.Geteuid() == 0 {
		// qemu dropped root once the machine was set up (-runas nobody).
		var qemu int
		for _, pid := range guestproc.GroupMembers(st.PID, false) {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.HasPrefix(string(comm), "qemu") {
				qemu = pid
			}
		}
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", qemu))
		if qemu == 0 || strings.Contains(string(status), "\nUid:\t0\t") {
			t.Fatalf("qemu (pid %d) runs as root:\n%s", qemu, status)
		}
	}
	port, _ := st.HostPort("http")
	var body string
	for {
		body, err = get(ctx, port)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			logs, _ := s.Logs(ctx, "web", 30)
			t.Fatalf("GET: %v\n%s", err, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if body != "hello from the vm\n" {
		t.Fatalf("body %q", body)
	}
	logs, _ := s.Logs(ctx, "web", 0)
	for _, want := range []string{"userdata: hello from web\n", "userdata: httpd on 8080\n"} {
		if !strings.Contains(string(logs), want) {
			t.Fatalf("serial log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(string(logs), "insmod") || strings.Contains(string(logs), "no eth0") {
		t.Fatalf("guest init reported a problem:\n%s", logs)
	}

	// A new substrate value over the same state dir finds it and stops it.
	s2, err := New(Config{StateDir: dir, ImageDir: s.cfg.ImageDir, Accelerator: s.cfg.Accelerator})
	if err != nil {
		t.Fatal(err)
	}
	gs, err := s2.List(ctx)
	if err != nil || len(gs) != 1 || gs[0].ID != "web" || gs[0].Phase != substrate.Running {
		t.Fatalf("list after restart: %+v %v", gs, err)
	}
	t1 := time.Now()
	if err := s2.Stop(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop: %s", time.Since(t1).Round(time.Millisecond))
	if st, _ := s.Status(ctx, "web"); st.Phase != substrate.Stopped {
		t.Fatalf("after stop: %+v", st)
	}
	if pids := substratetest.Procs(dir); len(pids) != 0 {
		t.Fatalf("qemu processes left: %v", pids)
	}
	if _, err := get(ctx, port); err == nil {
		t.Fatal("forwarded port still answers")
	}
}

func get(ctx context.Context, port int) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %d", resp.StatusCode)
	}
	return string(b), err
}

func TestUserDataExitAndSecrets(t *testing.T) {
	s, dir := newSub(t)
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	secret := fmt.Sprintf("vm-secret-%d", time.Now().UnixNano())
	sum := sha256.Sum256([]byte(secret))
	userData := `
echo "userdata: secret $(sha256sum "$SOCIALWEB_SECRETS_DIR/token" | cut -d' ' -f1) mode $(stat -c %a "$SOCIALWEB_SECRETS_DIR/token")"
exit 5
`
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "job", UserData: []byte(userData),
		Secrets: map[string][]byte{"token": []byte(secret)}}); err != nil {
		t.Fatal(err)
	}
	// While it runs: not on qemu's command line or environment.
	st, _ := s.Status(ctx, "job")
	for _, f := range []string{"cmdline", "environ"} {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/%s", st.PID, f))
		if strings.Contains(string(b), secret) {
			t.Fatalf("secret in the supervisor's %s", f)
		}
	}
	for _, pid := range substratetest.Procs(dir) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(b), secret) {
			t.Fatalf("secret on the command line of %d", pid)
		}
	}
	st, err := substrate.WaitEnded(ctx, s, "job")
	if err != nil {
		logs, _ := s.Logs(context.Background(), "job", 20)
		t.Fatalf("%v: %+v procs %v\n%s", err, st, substratetest.Procs(dir), logs)
	}
	logs, _ := s.Logs(ctx, "job", 0)
	if st.Phase != substrate.Exited || st.ExitCode != 5 {
		t.Fatalf("%+v\n%s", st, logs)
	}
	if !strings.Contains(string(logs), "userdata: secret "+hex.EncodeToString(sum[:])+" mode 400") {
		t.Fatalf("guest did not read the secret:\n%s", logs)
	}
	if strings.Contains(string(logs), secret) {
		t.Fatal("secret in the serial log")
	}
	// The per-guest initrd (which held the secret) is gone; no file left
	// in the guest dir holds it.
	filepath.WalkDir(filepath.Join(dir, "job"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if d.Name() == initrdFile {
				t.Errorf("per-guest initrd left: %s", p)
			}
			if b, _ := os.ReadFile(p); strings.Contains(string(b), secret) {
				t.Errorf("secret in %s", p)
			}
		}
		return nil
	})
	if pids := substratetest.Procs(dir); len(pids) != 0 {
		t.Fatalf("processes left: %v", pids)
	}
}

func TestInvalidSpecs(t *testing.T) {
	s, _ := newSub(t)
	ctx := context.Background()
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "x", Permissions: substrate.Permissions{Net: []string{"1.2.3.4"}}}); err == nil {
		t.Fatal("permissions accepted")
	}
	if _, err := New(Config{StateDir: t.TempDir(), ImageDir: t.TempDir()}); err == nil {
		t.Fatal("empty image dir accepted")
	}
}

// TestBootBenchmark prints the boot time to the started marker, median of
// 5, with the accelerator. Run with SOCIALWEB_VM_BENCH=1.
func TestBootBenchmark(t *testing.T) {
	if os.Getenv("SOCIALWEB_VM_BENCH") == "" {
		t.Skip("set SOCIALWEB_VM_BENCH=1")
	}
	img := testImage(t)
	dir := t.TempDir()
	s, err := New(Config{StateDir: dir, ImageDir: img, Accelerator: os.Getenv("SOCIALWEB_VM_ACCEL"), ExtraAppend: os.Getenv("SOCIALWEB_VM_APPEND")})
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, s, dir)
	ctx := context.Background()
	accel, _ := s.Accelerator(ctx)
	var ds, cpu []time.Duration
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("b%d", i)
		t0 := time.Now()
		if _, err := s.Boot(ctx, substrate.GuestSpec{ID: id, UserData: []byte("while :; do sleep 3600; done")}); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, bootTimeout)
		st, err := substrate.WaitRunning(wctx, s, id)
		cancel()
		if err != nil || st.Phase != substrate.Running {
			t.Fatalf("%+v %v", st, err)
		}
		ds = append(ds, time.Since(t0))
		cpu = append(cpu, guestproc.GroupCPU(st.PID))
		if err := s.Stop(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	sorted := append([]time.Duration(nil), ds...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	load, _ := os.ReadFile("/proc/loadavg")
	sort.Slice(cpu, func(i, j int) bool { return cpu[i] < cpu[j] })
	fmt.Printf("vm boot to %q: median %s of %v, accelerator %s (%s); qemu CPU time to the marker: median %s; host loadavg %s",
		MarkerStarted, sorted[2].Round(time.Millisecond), ds, accel, s.AcceleratorReason(ctx), cpu[2].Round(time.Millisecond), load)
}
