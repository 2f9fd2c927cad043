package nodehost

import (
	"time"

	"socialweb.computer/internal/scale"
)

// A pod's PodScheduled condition keeps its lastTransitionTime to the second, so when a pod
// became unschedulable is known only to lie in [t, t+1s). Taken as t, a batch could close up
// to a second before its idle time had passed since the newest pod (at once, for
// scale.SettledIdle). The node host's own first sight of the pod unschedulable is later than
// the truth by no more than a watch event's delivery, and tightens the bound.

// RefinePendingSince sets each unschedulable pod's PendingSince to when it was first seen so
// (seen, by pod name; now for a pod not seen before) kept within the second its condition
// names, and returns what was seen for the next decision: only pods still unschedulable.
func RefinePendingSince(now time.Time, pods []scale.Pod, seen map[string]time.Time) map[string]time.Time {
	next := map[string]time.Time{}
	for i := range pods {
		p := &pods[i]
		if !p.Unschedulable || p.PendingSince.IsZero() {
			continue
		}
		// A sight before the condition's time was of an earlier pod of the same name.
		at, ok := seen[p.Name]
		if !ok || at.Before(p.PendingSince) {
			at = now
		}
		next[p.Name] = at
		// A pod first seen long after it became unschedulable (this controller started
		// later) became so within the condition's second.
		if upper := p.PendingSince.Add(time.Second); at.After(upper) {
			at = upper
		}
		if at.After(p.PendingSince) {
			p.PendingSince = at
		}
	}
	return next
}
