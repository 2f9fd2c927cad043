// Package resourcemetrics turns what kubelets report on /metrics/resource into the figures the
// Metrics API (metrics.k8s.io) serves: CPU as a rate between two reports, memory as the last
// working set, per node and per container. It is pure: the tenant control plane scrapes the
// kubelets through its apiserver's node proxy and serves the API (internal/tenant/kube,
// docs/metrics.md).
package resourcemetrics

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The series of /metrics/resource that the Metrics API needs (kubelet's resource metrics
// endpoint, stable since Kubernetes 1.29).
const (
	nodeCPU         = "node_cpu_usage_seconds_total"
	nodeMemory      = "node_memory_working_set_bytes"
	containerCPU    = "container_cpu_usage_seconds_total"
	containerMemory = "container_memory_working_set_bytes"
)

// Sample is one reading: cumulative CPU seconds and working-set bytes at a time.
type Sample struct {
	CPUSeconds  float64
	MemoryBytes float64
	// CPUTime and MemoryTime are when the kubelet took each figure.
	CPUTime, MemoryTime time.Time
	hasCPU, hasMemory   bool
}

// ContainerKey names a container of a pod.
type ContainerKey struct{ Namespace, Pod, Container string }

// Report is one scrape of a node.
type Report struct {
	Node       Sample
	Containers map[ContainerKey]Sample
}

// ErrMalformed is a report that cannot be read.
var ErrMalformed = errors.New("malformed resource metrics")

// Parse reads the Prometheus text exposition of /metrics/resource. Series other than the
// four it needs are skipped; a sample without a timestamp takes at.
func Parse(text string, at time.Time) (Report, error) {
	r := Report{Containers: map[ContainerKey]Sample{}}
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, ts, err := parseLine(line)
		if err != nil {
			return Report{}, fmt.Errorf("%w: line %d: %v", ErrMalformed, n+1, err)
		}
		t := at
		if ts != 0 {
			t = time.UnixMilli(ts)
		}
		switch name {
		case nodeCPU:
			r.Node.CPUSeconds, r.Node.CPUTime, r.Node.hasCPU = value, t, true
		case nodeMemory:
			r.Node.MemoryBytes, r.Node.MemoryTime, r.Node.hasMemory = value, t, true
		case containerCPU, containerMemory:
			k := ContainerKey{Namespace: labels["namespace"], Pod: labels["pod"], Container: labels["container"]}
			if k.Namespace == "" || k.Pod == "" || k.Container == "" {
				continue
			}
			s := r.Containers[k]
			if name == containerCPU {
				s.CPUSeconds, s.CPUTime, s.hasCPU = value, t, true
			} else {
				s.MemoryBytes, s.MemoryTime, s.hasMemory = value, t, true
			}
			r.Containers[k] = s
		}
	}
	return r, nil
}

// parseLine reads `name{label="value",...} value [timestamp]`.
func parseLine(line string) (name string, labels map[string]string, value float64, ts int64, err error) {
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return "", nil, 0, 0, errors.New("no value")
	}
	name, rest := line[:i], line[i:]
	labels = map[string]string{}
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, " ,")
			if rest == "" {
				return "", nil, 0, 0, errors.New("unterminated labels")
			}
			if rest[0] == '}' {
				rest = rest[1:]
				break
			}
			eq := strings.IndexByte(rest, '=')
			if eq <= 0 || eq+1 >= len(rest) || rest[eq+1] != '"' {
				return "", nil, 0, 0, errors.New("bad label")
			}
			key := strings.TrimSpace(rest[:eq])
			rest = rest[eq+2:]
			var b strings.Builder
			closed := false
			for j := 0; j < len(rest); j++ {
				c := rest[j]
				if c == '\\' && j+1 < len(rest) {
					j++
					switch rest[j] {
					case 'n':
						b.WriteByte('\n')
					default:
						b.WriteByte(rest[j])
					}
					continue
				}
				if c == '"' {
					rest, closed = rest[j+1:], true
					break
				}
				b.WriteByte(c)
			}
			if !closed {
				return "", nil, 0, 0, errors.New("unterminated label value")
			}
			labels[key] = b.String()
		}
	}
	f := strings.Fields(rest)
	if len(f) < 1 || len(f) > 2 {
		return "", nil, 0, 0, errors.New("want a value and an optional timestamp")
	}
	value, err = strconv.ParseFloat(f[0], 64)
	if err != nil {
		return "", nil, 0, 0, err
	}
	if len(f) == 2 {
		if ts, err = strconv.ParseInt(f[1], 10, 64); err != nil {
			return "", nil, 0, 0, err
		}
	}
	return name, labels, value, ts, nil
}

// Usage is what the Metrics API reports for a node or a container: CPU in nanocores over
// [Timestamp-Window, Timestamp], memory in bytes at Timestamp.
type Usage struct {
	NanoCores   int64
	MemoryBytes int64
	Timestamp   time.Time
	Window      time.Duration
}

// rate is the usage between two samples of the same series, or false when there is no
// interval yet, the counter went back (a restarted container) or a figure is missing.
func rate(prev, cur Sample) (Usage, bool) {
	if !prev.hasCPU || !cur.hasCPU || !cur.hasMemory {
		return Usage{}, false
	}
	window := cur.CPUTime.Sub(prev.CPUTime)
	delta := cur.CPUSeconds - prev.CPUSeconds
	if window <= 0 || delta < 0 || math.IsNaN(delta) {
		return Usage{}, false
	}
	return Usage{
		NanoCores:   int64(delta / window.Seconds() * 1e9),
		MemoryBytes: int64(cur.MemoryBytes),
		Timestamp:   cur.CPUTime,
		Window:      window,
	}, true
}

// Store keeps the last two reports of each node.
type Store struct {
	mu    sync.RWMutex
	nodes map[string][2]Report // previous, latest
}

// NewStore is an empty store.
func NewStore() *Store { return &Store{nodes: map[string][2]Report{}} }

// Add records a node's report.
func (s *Store) Add(node string, r Report) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.nodes[node]
	s.nodes[node] = [2]Report{prev[1], r}
}

// Forget drops the nodes not in keep (nodes gone from the cluster).
func (s *Store) Forget(keep map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n := range s.nodes {
		if !keep[n] {
			delete(s.nodes, n)
		}
	}
}

// Node is the usage of node, once two reports of it are in.
func (s *Store) Node(node string) (Usage, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.nodes[node]
	if !ok {
		return Usage{}, false
	}
	return rate(r[0].Node, r[1].Node)
}

// ContainerUsage is a container's name and usage.
type ContainerUsage struct {
	Name string
	Usage
}

// Pod is the usage of each container of the pod namespace/name on any node, once two
// reports of every one of them are in; the pod's timestamp and window are the earliest of its
// containers'.
func (s *Store) Pod(namespace, name string) ([]ContainerUsage, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []ContainerUsage
	for _, r := range s.nodes {
		for k, cur := range r[1].Containers {
			if k.Namespace != namespace || k.Pod != name {
				continue
			}
			u, ok := rate(r[0].Containers[k], cur)
			if !ok {
				return nil, false
			}
			out = append(out, ContainerUsage{Name: k.Container, Usage: u})
		}
		if len(out) > 0 {
			break
		}
	}
	return out, len(out) > 0
}
