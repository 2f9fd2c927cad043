package hostcap

import (
	"strings"
	"testing"
)

func TestMemTotal(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     int64
		wantErr  bool
	}{
		{"typical", "MemFree:  100 kB\nMemTotal:       24576000 kB\n", 24576000 << 10, false},
		{"missing", "MemFree: 100 kB\n", 0, true},
		{"not a number", "MemTotal: lots kB\n", 0, true},
		{"zero", "MemTotal: 0 kB\n", 0, true},
		{"negative", "MemTotal: -5 kB\n", 0, true},
		{"empty", "", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := memTotal(strings.NewReader(tc.in))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("memTotal = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestReadThisHost(t *testing.T) {
	c, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	if c.MilliCPU < 1000 || c.MemMiB() < 1 {
		t.Fatalf("Read = %+v; a host has at least one CPU and one MiB", c)
	}
}
