package nodehost

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"socialweb.computer/internal/scale"
)

func TestRefinePendingSince(t *testing.T) {
	cond := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC) // the condition's second
	cases := []struct {
		name     string
		now      time.Time
		seen     map[string]time.Time
		pod      scale.Pod
		want     time.Time
		wantSeen map[string]time.Time
	}{
		{name: "first seen within the condition's second: that moment",
			now: cond.Add(400 * time.Millisecond), pod: scale.Pod{Name: "a", Unschedulable: true, PendingSince: cond},
			want: cond.Add(400 * time.Millisecond), wantSeen: map[string]time.Time{"a": cond.Add(400 * time.Millisecond)}},
		{name: "seen before: the first sight stays",
			now: cond.Add(900 * time.Millisecond), seen: map[string]time.Time{"a": cond.Add(100 * time.Millisecond)},
			pod:  scale.Pod{Name: "a", Unschedulable: true, PendingSince: cond},
			want: cond.Add(100 * time.Millisecond), wantSeen: map[string]time.Time{"a": cond.Add(100 * time.Millisecond)}},
		{name: "first seen a minute later: the end of the condition's second",
			now: cond.Add(time.Minute), pod: scale.Pod{Name: "a", Unschedulable: true, PendingSince: cond},
			want: cond.Add(time.Second), wantSeen: map[string]time.Time{"a": cond.Add(time.Minute)}},
		{name: "a sight older than the condition was of an earlier pod of the name",
			now: cond.Add(200 * time.Millisecond), seen: map[string]time.Time{"a": cond.Add(-time.Hour)},
			pod:  scale.Pod{Name: "a", Unschedulable: true, PendingSince: cond},
			want: cond.Add(200 * time.Millisecond), wantSeen: map[string]time.Time{"a": cond.Add(200 * time.Millisecond)}},
		{name: "a bound pod is left alone and forgotten",
			now: cond, seen: map[string]time.Time{"a": cond},
			pod:  scale.Pod{Name: "a", Node: "n1"},
			want: time.Time{}, wantSeen: map[string]time.Time{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pods := []scale.Pod{tc.pod}
			seen := RefinePendingSince(tc.now, pods, tc.seen)
			if !pods[0].PendingSince.Equal(tc.want) {
				t.Errorf("PendingSince %v, want %v", pods[0].PendingSince, tc.want)
			}
			if diff := cmp.Diff(tc.wantSeen, seen); diff != "" {
				t.Errorf("seen (-want +got):\n%s", diff)
			}
		})
	}
}
