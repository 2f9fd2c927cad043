package resourcemetrics

import (
	"errors"
	"testing"
	"time"
)

// As a kubelet of this Kubernetes version prints /metrics/resource.
const report1 = `# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container="c",namespace="default",pod="web"} 1.5 1700000000000
container_cpu_usage_seconds_total{container="side",namespace="default",pod="web"} 0.25 1700000000000
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container="c",namespace="default",pod="web"} 1.048576e+06 1700000000000
container_memory_working_set_bytes{container="side",namespace="default",pod="web"} 2048 1700000000000
# TYPE container_start_time_seconds gauge
container_start_time_seconds{container="c",namespace="default",pod="web"} 1.69e+09 1690000000000
node_cpu_usage_seconds_total 100 1700000000000
node_memory_working_set_bytes 5e+08 1700000000000
# TYPE scrape_error gauge
scrape_error 0
`

const report2 = `container_cpu_usage_seconds_total{container="c",namespace="default",pod="web"} 3.5 1700000010000
container_cpu_usage_seconds_total{container="side",namespace="default",pod="web"} 0.25 1700000010000
container_memory_working_set_bytes{container="c",namespace="default",pod="web"} 2.097152e+06 1700000010000
container_memory_working_set_bytes{container="side",namespace="default",pod="web"} 4096 1700000010000
node_cpu_usage_seconds_total 105 1700000010000
node_memory_working_set_bytes 6e+08 1700000010000
`

func TestParseAndRates(t *testing.T) {
	r1, err := Parse(report1, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(r1.Containers) != 2 || r1.Node.CPUSeconds != 100 || r1.Node.MemoryBytes != 5e8 {
		t.Fatalf("report 1: %+v", r1)
	}
	r2, err := Parse(report2, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore()
	s.Add("node-a", r1)
	if _, ok := s.Node("node-a"); ok {
		t.Fatal("a rate from one report")
	}
	if _, ok := s.Pod("default", "web"); ok {
		t.Fatal("a pod rate from one report")
	}
	s.Add("node-a", r2)
	n, ok := s.Node("node-a")
	// 5 CPU-seconds over 10 s: half a core.
	if !ok || n.NanoCores != 500_000_000 || n.MemoryBytes != 600_000_000 || n.Window != 10*time.Second || !n.Timestamp.Equal(time.UnixMilli(1700000010000)) {
		t.Fatalf("node usage %+v %v", n, ok)
	}
	p, ok := s.Pod("default", "web")
	if !ok || len(p) != 2 {
		t.Fatalf("pod usage %+v %v", p, ok)
	}
	for _, c := range p {
		switch c.Name {
		case "c":
			if c.NanoCores != 200_000_000 || c.MemoryBytes != 2097152 {
				t.Errorf("container c: %+v", c)
			}
		case "side":
			if c.NanoCores != 0 || c.MemoryBytes != 4096 {
				t.Errorf("container side: %+v", c)
			}
		}
	}
	if _, ok := s.Pod("default", "other"); ok {
		t.Error("a pod that is not there")
	}
	// A counter that went back (the container restarted) gives no rate until the next.
	s.Add("node-a", r1)
	if _, ok := s.Node("node-a"); ok {
		t.Error("a rate across a counter reset")
	}
	s.Forget(map[string]bool{})
	if _, ok := s.Node("node-a"); ok {
		t.Error("a forgotten node")
	}
}

func TestParseLabelsAndErrors(t *testing.T) {
	r, err := Parse(`container_memory_working_set_bytes{container="a\"b",namespace="ns",pod="p, q"} 7`, time.UnixMilli(42))
	if err != nil {
		t.Fatal(err)
	}
	s, ok := r.Containers[ContainerKey{Namespace: "ns", Pod: "p, q", Container: `a"b`}]
	if !ok || s.MemoryBytes != 7 || !s.MemoryTime.Equal(time.UnixMilli(42)) {
		t.Fatalf("%+v", r.Containers)
	}
	for _, bad := range []string{
		`node_cpu_usage_seconds_total`,
		`node_cpu_usage_seconds_total abc`,
		`container_cpu_usage_seconds_total{container="a} 1`,
		`container_cpu_usage_seconds_total{container=a} 1`,
		`node_cpu_usage_seconds_total 1 2 3`,
	} {
		if _, err := Parse(bad, time.Now()); !errors.Is(err, ErrMalformed) {
			t.Errorf("%q: %v, want ErrMalformed", bad, err)
		}
	}
}
