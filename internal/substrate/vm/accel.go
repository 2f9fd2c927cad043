package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"socialweb.computer/internal/substrate/guestproc"
)

// accelResult is the outcome of a probe, cached per host: in this process
// and in <CacheDir>/vm-accelerator.json, for as long as the host's boot,
// the qemu binary and the kernel are the same (the key).
type accelResult struct {
	Key         string    `json:"key"`
	Accelerator string    `json:"accelerator"`
	Reason      string    `json:"reason"`
	ProbedAt    time.Time `json:"probedAt"`
	ProbeMillis int64     `json:"probeMillis,omitempty"`
}

// Accelerator returns the accelerator guests boot with: the configured one,
// else the cached probe, else a fresh probe.
func (s *Substrate) Accelerator(ctx context.Context) (string, error) {
	if s.cfg.Accelerator != "" {
		return s.cfg.Accelerator, nil
	}
	r, err := s.probe(ctx)
	return r.Accelerator, err
}

// AcceleratorReason says why the probe chose what it chose.
func (s *Substrate) AcceleratorReason(ctx context.Context) string {
	if s.cfg.Accelerator != "" {
		return "configured"
	}
	r, _ := s.probe(ctx)
	return r.Reason
}

func (s *Substrate) probeKey() string {
	h := sha256.New()
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	h.Write(boot)
	if fi, err := os.Stat(s.cfg.QEMU); err == nil {
		fmt.Fprintf(h, "%s %d %d\n", s.cfg.QEMU, fi.Size(), fi.ModTime().UnixNano())
	}
	fmt.Fprintln(h, s.img.Manifest.KernelSHA256, s.img.Manifest.PVHKernelSHA256)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

var (
	probeMu    sync.Mutex
	probeCache = map[string]accelResult{}
)

func (s *Substrate) probe(ctx context.Context) (accelResult, error) {
	probeMu.Lock()
	defer probeMu.Unlock()
	key := s.probeKey()
	if r, ok := probeCache[key]; ok {
		return r, nil
	}
	cache := filepath.Join(s.cfg.CacheDir, "vm-accelerator.json")
	var r accelResult
	if err := guestproc.ReadJSON(cache, &r); err == nil && r.Key == key && (r.Accelerator == KVM || r.Accelerator == TCG) {
		probeCache[key] = r
		return r, nil
	}
	r = accelResult{Key: key, Accelerator: TCG, ProbedAt: time.Now().UTC()}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		r.Reason = "no usable /dev/kvm: " + err.Error()
	} else {
		f.Close()
		t0 := time.Now()
		ok, why, err := s.probeBoot(ctx, KVM)
		if err != nil {
			return r, err
		}
		r.ProbeMillis = time.Since(t0).Milliseconds()
		if ok {
			r.Accelerator, r.Reason = KVM, fmt.Sprintf("a test boot under kvm reached init in %d ms", r.ProbeMillis)
		} else {
			r.Reason = "a test boot under kvm failed: " + why
		}
	}
	probeCache[key] = r
	if err := os.MkdirAll(s.cfg.CacheDir, 0o700); err == nil {
		_ = guestproc.WriteJSON(cache, r)
	}
	return r, nil
}

// probeBoot boots the image under accel with the init's probe mode, which
// prints a marker and powers off at once.
func (s *Substrate) probeBoot(ctx context.Context, accel string) (bool, string, error) {
	dir, err := os.MkdirTemp(s.cfg.StateDir, ".probe-")
	if err != nil {
		return false, "", err
	}
	defer os.RemoveAll(dir)
	serial := filepath.Join(dir, serialFile)
	argv := s.qemuArgv(accel, serial, s.img.Initrd, s.kernelAppend(accel, "socialweb.probe"), 1, 128, nil)
	rec, err := guestproc.Start(guestproc.StartOptions{Dir: dir, Argv: argv, Env: []string{}, Cwd: dir})
	if err != nil {
		return false, "", err
	}
	defer guestproc.KillGroup(context.Background(), rec.PID, time.Second)
	deadline := time.Now().Add(s.cfg.ProbeTimeout)
	why := fmt.Sprintf("no marker within %s", s.cfg.ProbeTimeout)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(serial)
		if strings.Contains(string(b), markerProbe) {
			return true, "", nil
		}
		if _, _, exited := guestproc.Exit(dir); exited {
			// The marker may have come just before the exit.
			if b, _ := os.ReadFile(serial); strings.Contains(string(b), markerProbe) {
				return true, "", nil
			}
			why = "qemu exited before the marker"
			break
		}
		select {
		case <-ctx.Done():
			return false, "", ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	_ = syscall.Kill(-rec.PID, syscall.SIGTERM)
	out, _ := guestproc.Tail(filepath.Join(dir, guestproc.LogFile), 2)
	ser, _ := guestproc.Tail(serial, 1)
	if t := strings.TrimSpace(string(out) + " " + string(ser)); t != "" {
		why += " (" + strings.Join(strings.Fields(t), " ") + ")"
	}
	return false, why, nil
}
