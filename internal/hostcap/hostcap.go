// Package hostcap reads what the host has to sell: its CPUs and its memory. A bidder bounds
// the guests it bids for by it, and a node's kubelet reads the same figures as the node's
// capacity, so both take them from here.
package hostcap

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Capacity is the host's CPUs (in millicores) and memory (MemTotal, in bytes).
type Capacity struct {
	MilliCPU int64
	MemBytes int64
}

// MemMiB is the memory in whole MiB.
func (c Capacity) MemMiB() int64 { return c.MemBytes >> 20 }

// Read returns this host's capacity: runtime.NumCPU and /proc/meminfo's MemTotal.
func Read() (Capacity, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return Capacity{}, err
	}
	defer f.Close()
	mem, err := memTotal(f)
	if err != nil {
		return Capacity{}, fmt.Errorf("/proc/meminfo: %w", err)
	}
	return Capacity{MilliCPU: int64(runtime.NumCPU()) * 1000, MemBytes: mem}, nil
}

// memTotal parses MemTotal (in kB) from a meminfo file and returns it in bytes.
func memTotal(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil || kb <= 0 {
				return 0, fmt.Errorf("MemTotal %q is not a positive number of kB", fields[1])
			}
			return kb << 10, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no MemTotal line")
}
