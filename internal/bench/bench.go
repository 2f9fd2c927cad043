// Package bench measures socialweb and prints each figure beside its target.
// Each benchmark runs the real binary or the real in-process stack on loopback; nothing
// here asserts a number: figures are for people and for comparing builds.
package bench

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
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

// Printer writes aligned result lines.
type Printer struct{ W io.Writer }

// Line prints one figure.
func (p Printer) Line(name, value, target string) {
	if target != "" {
		target = "  (target " + target + ")"
	}
	fmt.Fprintf(p.W, "%-52s %s%s\n", name, value, target)
}

// LoadAvg is the load averages over 1, 5 and 15 minutes, as /proc/loadavg has them: the
// machine's other work skews wall times, and every figure is printed with it.
func LoadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
