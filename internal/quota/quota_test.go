package quota

import (
	"testing"
	"time"
)

func TestCheckClusters(t *testing.T) {
	for _, c := range []struct {
		name  string
		limit int
		used  int
		want  bool // refused
	}{
		{"none held", 3, 0, false},
		{"one below the limit", 3, 2, false},
		{"at the limit: the next is refused", 3, 3, true},
		{"past a lowered limit", 1, 4, true},
		{"no limit", 0, 100, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := CheckClusters(Limits{Clusters: c.limit}, "did:plc:a", c.used)
			if (e != nil) != c.want {
				t.Fatalf("CheckClusters(limit %d, used %d) = %v, want refused %v", c.limit, c.used, e, c.want)
			}
			if e != nil && (e.Quota != QuotaClusters || e.Limit != c.limit || e.Used != c.used) {
				t.Errorf("refusal %+v does not name the quota, its limit and the use", e)
			}
		})
	}
}

func TestNodeTime(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	h := func(n float64) time.Duration { return time.Duration(n * float64(time.Hour)) }
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	for _, c := range []struct {
		name string
		ivs  []Interval
		want time.Duration
	}{
		{"nothing", nil, 0},
		{"one running node since 2h", []Interval{{From: ago(h(2))}}, h(2)},
		{"one ended node", []Interval{{From: ago(h(5)), To: ago(h(3))}}, h(2)},
		{"a running and an ended node", []Interval{{From: ago(h(1))}, {From: ago(h(10)), To: ago(h(7))}}, h(4)},
		{"an interval older than the window counts nothing", []Interval{{From: ago(Window + h(5)), To: ago(Window + h(1))}}, 0},
		{"one straddling the window counts its part inside", []Interval{{From: ago(Window + h(5)), To: ago(Window - h(2))}}, h(2)},
		{"a node up longer than the window counts the window", []Interval{{From: ago(Window + h(100))}}, Window},
		{"an end in the future is now", []Interval{{From: ago(h(1)), To: now.Add(h(1))}}, h(1)},
		{"an end before the start counts nothing", []Interval{{From: ago(h(1)), To: ago(h(2))}}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := NodeTime(c.ivs, now); got != c.want {
				t.Errorf("NodeTime = %s, want %s", got, c.want)
			}
		})
	}
}

func TestNodes(t *testing.T) {
	l := Limits{Nodes: 3, NodeHours: 10}
	for _, c := range []struct {
		name      string
		l         Limits
		u         Usage
		want      int
		allowed   int
		exceeded  string
		usedShown int
	}{
		{"first node", l, Usage{}, 1, 1, "", 0},
		{"up to the limit", l, Usage{Nodes: 1}, 2, 2, "", 0},
		{"past the limit: cut to what is left", l, Usage{Nodes: 2}, 2, 1, QuotaNodes, 2},
		{"at the limit: none", l, Usage{Nodes: 3}, 1, 0, QuotaNodes, 3},
		{"above a lowered limit: none, nothing taken away", Limits{Nodes: 1}, Usage{Nodes: 3}, 1, 0, QuotaNodes, 3},
		{"node-hours used up: none", l, Usage{Nodes: 0, NodeTime: 10 * time.Hour}, 1, 0, QuotaNodeHours, 10},
		{"node-hours past the limit: none", l, Usage{Nodes: 1, NodeTime: 12*time.Hour + 30*time.Minute}, 1, 0, QuotaNodeHours, 12},
		{"node-hours just under: allowed", l, Usage{NodeTime: 10*time.Hour - time.Second}, 1, 1, "", 0},
		{"no limits", Limits{}, Usage{Nodes: 50, NodeTime: 1000 * time.Hour}, 5, 5, "", 0},
		{"nothing wanted", l, Usage{Nodes: 3}, 0, 0, "", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, e := Nodes(c.l, "did:plc:a", c.u, c.want)
			if n != c.allowed {
				t.Errorf("allowed %d of %d, want %d", n, c.want, c.allowed)
			}
			switch {
			case c.exceeded == "" && e != nil:
				t.Errorf("refused %v", e)
			case c.exceeded != "" && e == nil:
				t.Errorf("not refused, want %s", c.exceeded)
			case e != nil && (e.Quota != c.exceeded || e.Used != c.usedShown):
				t.Errorf("refusal %+v, want quota %s used %d", e, c.exceeded, c.usedShown)
			}
		})
	}
}

func TestPrune(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	old := Interval{From: now.Add(-Window - 3*time.Hour), To: now.Add(-Window - time.Hour)}
	straddling := Interval{From: now.Add(-Window - time.Hour), To: now.Add(-Window + time.Hour)}
	recent := Interval{From: now.Add(-2 * time.Hour), To: now.Add(-time.Hour)}
	got := Prune([]Interval{recent, old, straddling}, now)
	if len(got) != 2 || got[0] != straddling || got[1] != recent {
		t.Errorf("Prune = %v, want the straddling and the recent one, oldest first", got)
	}
}
