package nodehost

import (
	"slices"
	"testing"

	"socialweb.computer/internal/controllers/cluster"
	"socialweb.computer/internal/scale"
)

// The Cluster controller keeps a cluster awake on these Scaling reasons: they must be the
// names this package gives the scale decision's reasons for pods waiting for a node.
func TestDemandReasonsAreTheNodeHostsNames(t *testing.T) {
	want := []string{ConditionReason(scale.ReasonBatching), ConditionReason(scale.ReasonInFlight),
		ConditionReason(scale.ReasonIntentNoNode), ConditionReason(scale.ReasonIntentBeyond)}
	if !slices.Equal(cluster.DemandReasons, want) {
		t.Errorf("cluster.DemandReasons = %v; the node host names them %v", cluster.DemandReasons, want)
	}
}
