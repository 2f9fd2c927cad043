// Package bench measures socialweb and prints each figure beside its target.
// Each benchmark runs the real binary or the real in-process stack on loopback; nothing
// here asserts a number: figures are for people and for comparing builds.
package bench

import (
	"fmt"
	"io"
	"os"
	"sort"
	"time"
)

// Percentile returns the p-th percentile (0..100) of ds by nearest rank.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p/100*float64(len(s))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

// Median is Percentile 50.
func Median(ds []time.Duration) time.Duration { return Percentile(ds, 50) }

// ms formats a duration in milliseconds with two decimals.
func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// tb adapts the harness's test interface for use outside `go test`.
type tb struct {
	tmp      string
	cleanups []func()
	failed   error
}

func newTB() (*tb, error) {
	d, err := os.MkdirTemp("", "socialweb-bench-")
	if err != nil {
		return nil, err
	}
	return &tb{tmp: d}, nil
}

func (t *tb) Helper() {}
func (t *tb) Fatalf(format string, args ...any) {
	t.failed = fmt.Errorf(format, args...)
	panic(t)
}
func (t *tb) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }
func (t *tb) TempDir() string {
	d, _ := os.MkdirTemp(t.tmp, "t")
	return d
}
func (t *tb) close() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	os.RemoveAll(t.tmp)
}

// run calls f with a fresh tb and turns a Fatalf into an error.
func run(f func(t *tb) error) (err error) {
	t, err := newTB()
	if err != nil {
		return err
	}
	defer t.close()
	defer func() {
		if r := recover(); r != nil {
			if r == any(t) {
				err = t.failed
				return
			}
			panic(r)
		}
	}()
	return f(t)
}

// Printer writes aligned result lines.
type Printer struct{ W io.Writer }

// Line prints one figure.
func (p Printer) Line(name, value, target string) {
	if target != "" {
		target = "  (target " + target + ")"
	}
	fmt.Fprintf(p.W, "%-52s %s%s\n", name, value, target)
}
