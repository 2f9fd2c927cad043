package quota

import (
	"fmt"
	"sort"
	"time"
)

// Window is the span node-hours are counted over: the last 30 days, rolling.
const Window = 30 * 24 * time.Hour

// Defaults for one machine: a few clusters and nodes per account, and node-hours worth one
// node around the clock for ten days of the window.
const (
	DefaultClusters  = 3
	DefaultNodes     = 3
	DefaultNodeHours = 240
)

// Limits is what one account may hold. A limit of 0 means no limit.
type Limits struct {
	// Clusters bounds the account's Cluster objects (those being deleted count until gone).
	Clusters int
	// Nodes bounds the account's NodeClaims across all its clusters (a node being released
	// counts until its claim is gone).
	Nodes int
	// NodeHours bounds the time the account's nodes existed within Window.
	NodeHours int
}

// DefaultLimits are the limits for one machine.
func DefaultLimits() Limits {
	return Limits{Clusters: DefaultClusters, Nodes: DefaultNodes, NodeHours: DefaultNodeHours}
}

// Names of the quotas, as errors and flags name them.
const (
	QuotaClusters  = "clusters"
	QuotaNodes     = "nodes"
	QuotaNodeHours = "node-hours"
)

// Exceeded is the refusal of a creation past a quota: which quota, its limit and the
// account's use.
type Exceeded struct {
	Account string
	Quota   string
	Limit   int
	// Used is the account's current use: a count, or for node-hours the hours (rounded down).
	Used int
}

func (e *Exceeded) Error() string {
	return fmt.Sprintf("quota %s exceeded: account %s uses %d of %d %s", e.Quota, e.Account, e.Used, e.Limit, e.Quota)
}

// CheckClusters allows one more cluster to an account that holds used clusters.
func CheckClusters(l Limits, account string, used int) *Exceeded {
	if l.Clusters > 0 && used >= l.Clusters {
		return &Exceeded{Account: account, Quota: QuotaClusters, Limit: l.Clusters, Used: used}
	}
	return nil
}

// Interval is the time one node of the account existed: From its claim's creation to To,
// its end (zero while it exists).
type Interval struct {
	From, To time.Time
}

// NodeTime is how long the account's nodes existed within Window before now: each
// interval's overlap with [now-Window, now], an open one ending now.
func NodeTime(intervals []Interval, now time.Time) time.Duration {
	start := now.Add(-Window)
	var total time.Duration
	for _, iv := range intervals {
		from, to := iv.From, iv.To
		if to.IsZero() || to.After(now) {
			to = now
		}
		if from.Before(start) {
			from = start
		}
		if to.After(from) {
			total += to.Sub(from)
		}
	}
	return total
}

// Usage is what an account holds of nodes.
type Usage struct {
	// Nodes is the account's NodeClaims, across its clusters.
	Nodes int
	// NodeTime is NodeTime of the account's nodes.
	NodeTime time.Duration
}

// Nodes decides how many of want new nodes the account may get: want, cut to what is left
// of the nodes quota; none once its node-hours are used up. When it allows fewer than want
// it says which quota cut it.
func Nodes(l Limits, account string, u Usage, want int) (int, *Exceeded) {
	if want <= 0 {
		return 0, nil
	}
	if l.NodeHours > 0 && u.NodeTime >= time.Duration(l.NodeHours)*time.Hour {
		return 0, &Exceeded{Account: account, Quota: QuotaNodeHours, Limit: l.NodeHours, Used: int(u.NodeTime / time.Hour)}
	}
	if l.Nodes > 0 && u.Nodes+want > l.Nodes {
		allowed := max(l.Nodes-u.Nodes, 0)
		return allowed, &Exceeded{Account: account, Quota: QuotaNodes, Limit: l.Nodes, Used: u.Nodes}
	}
	return want, nil
}

// Prune keeps the intervals that still overlap the window before now, oldest first: what a
// ledger of ended nodes must remember.
func Prune(intervals []Interval, now time.Time) []Interval {
	start := now.Add(-Window)
	var out []Interval
	for _, iv := range intervals {
		if iv.To.IsZero() || iv.To.After(start) {
			out = append(out, iv)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].From.Before(out[j].From) })
	return out
}

// FormatInterval and ParseInterval are an interval as a ledger keeps it: "FROM TO" in Unix
// seconds.
func FormatInterval(iv Interval) string {
	return fmt.Sprintf("%d %d", iv.From.Unix(), iv.To.Unix())
}

// ParseInterval reads what FormatInterval wrote.
func ParseInterval(s string) (Interval, error) {
	var from, to int64
	if _, err := fmt.Sscanf(s, "%d %d", &from, &to); err != nil {
		return Interval{}, fmt.Errorf("node-time interval %q: %w", s, err)
	}
	return Interval{From: time.Unix(from, 0), To: time.Unix(to, 0)}, nil
}
