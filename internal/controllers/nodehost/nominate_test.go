package nodehost

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"socialweb.computer/internal/scale"
)

func TestNominations(t *testing.T) {
	pending := func(name, nominated string) scale.Pod {
		return scale.Pod{Name: name, Unschedulable: true, Nominated: nominated}
	}
	sim := &scale.Simulation{
		NewNodes:    2,
		OnNodes:     map[string]string{"app/a": "node-old", "app/b": "node-flight"},
		NewNodePods: [][]string{{"app/c", "app/d"}, {"app/e"}},
	}
	d := scale.Decision{Action: scale.Provision, Provision: 2, NewNodePods: sim.NewNodePods}
	cases := []struct {
		name        string
		pods        []scale.Pod
		sim         *scale.Simulation
		d           scale.Decision
		provisioned []string
		want        []Nomination
	}{{
		name:        "every placed pending pod, on the node the simulation chose",
		pods:        []scale.Pod{pending("app/e", ""), pending("app/a", ""), pending("app/b", ""), pending("app/c", ""), pending("app/d", "")},
		sim:         sim,
		d:           d,
		provisioned: []string{"new-x", "new-y"},
		want: []Nomination{{"app/a", "node-old"}, {"app/b", "node-flight"}, {"app/c", "new-x"},
			{"app/d", "new-x"}, {"app/e", "new-y"}},
	}, {
		name:        "already nominated there: nothing to patch; nominated elsewhere: moved",
		pods:        []scale.Pod{pending("app/a", "node-old"), pending("app/c", "node-old")},
		sim:         sim,
		d:           d,
		provisioned: []string{"new-x", "new-y"},
		want:        []Nomination{{"app/c", "new-x"}},
	}, {
		name:        "a quota cut the claims: the pods of nodes not claimed wait unnominated",
		pods:        []scale.Pod{pending("app/c", ""), pending("app/e", "")},
		sim:         sim,
		d:           d,
		provisioned: []string{"new-x"},
		want:        []Nomination{{"app/c", "new-x"}},
	}, {
		name: "no claim made (a hold): only the pods placed on nodes that exist or are coming",
		pods: []scale.Pod{pending("app/a", ""), pending("app/c", "")},
		sim:  sim,
		d:    scale.Decision{Action: scale.Hold},
		want: []Nomination{{"app/a", "node-old"}},
	}, {
		name: "bound, finished or schedulable pods are left alone",
		pods: []scale.Pod{{Name: "app/a", Node: "node-old"}, {Name: "app/b", Unschedulable: true, Finished: true},
			{Name: "app/c"}},
		sim:         sim,
		d:           d,
		provisioned: []string{"new-x", "new-y"},
	}, {
		name: "no simulation: no nominations",
		pods: []scale.Pod{pending("app/a", "")},
		d:    d,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Nominations(scale.Input{Pods: tc.pods, Simulated: tc.sim}, tc.d, tc.provisioned)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("nominations (-want +got):\n%s", diff)
			}
		})
	}
}
