package bench

import (
	"crypto/sha256"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// hostReference measures the two host properties the core's write path rests on, so a create
// rate can be read against the machine it was taken on: the disk's fdatasync latency for a
// small append to a preallocated file (what etcd's WAL does once per write), and single-core
// sha256 throughput as a plain CPU yardstick.
func hostReference(dir string) (string, error) {
	f, err := os.CreateTemp(dir, "fsync-")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, 16<<20); err != nil {
		return "", fmt.Errorf("preallocating %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	entry := make([]byte, 1536)
	syncs := make([]time.Duration, 0, 300)
	for range cap(syncs) {
		if _, err := f.Write(entry); err != nil {
			return "", err
		}
		t := time.Now()
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return "", err
		}
		syncs = append(syncs, time.Since(t))
	}

	block := make([]byte, 8<<10)
	var hashed int
	t0 := time.Now()
	for time.Since(t0) < 300*time.Millisecond {
		sha256.Sum256(block)
		hashed += len(block)
	}
	mbps := float64(hashed) / time.Since(t0).Seconds() / 1e6
	return fmt.Sprintf("fdatasync of a %d-byte append p50 %s, p99 %s; sha256 %.0f MB/s on one core",
		len(entry), ms(Median(syncs)), ms(Percentile(syncs, 99)), mbps), nil
}

// cost is what a stretch of in-process work used: CPU time of this whole process (client,
// API server and etcd together), in user code and in the kernel, and etcd's WAL fsyncs.
type cost struct {
	user, sys  time.Duration
	fsyncs     uint64
	fsyncTotal time.Duration
}

func costNow() (cost, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return cost{}, err
	}
	c := cost{user: time.Duration(ru.Utime.Nano()), sys: time.Duration(ru.Stime.Nano())}
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return cost{}, err
	}
	i := slices.IndexFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == "etcd_disk_wal_fsync_duration_seconds" })
	if i < 0 {
		return c, nil
	}
	for _, m := range mfs[i].GetMetric() {
		h := m.GetHistogram()
		c.fsyncs += h.GetSampleCount()
		c.fsyncTotal += time.Duration(h.GetSampleSum() * float64(time.Second))
	}
	return c, nil
}

// per says what each of n operations cost between two readings.
func (c cost) per(after cost, n int) string {
	user, sys := (after.user-c.user)/time.Duration(n), (after.sys-c.sys)/time.Duration(n)
	s := fmt.Sprintf("CPU %s a create (user %s, system %s)", ms(user+sys), ms(user), ms(sys))
	if k := after.fsyncs - c.fsyncs; k > 0 {
		s += fmt.Sprintf(", etcd WAL fsync %s a write (%d writes)", ms((after.fsyncTotal-c.fsyncTotal)/time.Duration(k)), k)
	}
	return s
}
