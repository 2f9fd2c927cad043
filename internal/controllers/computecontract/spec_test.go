package computecontract

import (
	"strings"
	"testing"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/market"
)

func TestSpecState(t *testing.T) {
	now := time.Unix(1000, 0)
	repo := &v1alpha1.ObjectRef{Name: "me"}
	secs := int32(7)
	for _, c := range []struct {
		name     string
		spec     v1alpha1.ComputeContractSpec
		deleting bool
		check    func(market.State, string, market.Boundary) bool
		err      string
	}{
		{"defaults", v1alpha1.ComputeContractSpec{RepoRef: repo}, false, func(s market.State, p string, b market.Boundary) bool {
			return s.Window == market.DefaultBidWindow && s.AnswerWait == market.DefaultAnswerWait &&
				s.ReadyTimeout == market.DefaultReadyTimeout && p == market.PolicyOpen && b == market.BoundaryNone && !s.Release
		}, ""},
		{"args and timeout", v1alpha1.ComputeContractSpec{RepoRef: repo, Policy: "only_me", VMReadyTimeoutSec: &secs,
			PolicyArgs: map[string]string{market.ArgBidWindow: "2", market.ArgAnswerWait: "0.5"}}, false, func(s market.State, p string, _ market.Boundary) bool {
			return s.Window == 2*time.Second && s.AnswerWait == 500*time.Millisecond && s.ReadyTimeout == 7*time.Second && p == market.PolicyOnlyMe
		}, ""},
		{"deleting asks the release", v1alpha1.ComputeContractSpec{RepoRef: repo}, true, func(s market.State, _ string, _ market.Boundary) bool { return s.Release }, ""},
		{"release asked", v1alpha1.ComputeContractSpec{RepoRef: repo, Release: &v1alpha1.ContractRelease{}}, false, func(s market.State, _ string, _ market.Boundary) bool { return s.Release }, ""},
		{"isolation", v1alpha1.ComputeContractSpec{RepoRef: repo, RequireIsolation: v1alpha1.IsolationVM}, false, func(_ market.State, _ string, b market.Boundary) bool { return b == market.BoundaryVM }, ""},
		{"bad window", v1alpha1.ComputeContractSpec{RepoRef: repo, PolicyArgs: map[string]string{market.ArgBidWindow: "-1"}}, false, nil, market.ArgBidWindow},
		{"bad answer wait", v1alpha1.ComputeContractSpec{RepoRef: repo, PolicyArgs: map[string]string{market.ArgAnswerWait: "soon"}}, false, nil, market.ArgAnswerWait},
		{"unknown policy", v1alpha1.ComputeContractSpec{RepoRef: repo, Policy: "cheapest"}, false, nil, "unknown policy"},
		{"bad isolation", v1alpha1.ComputeContractSpec{RepoRef: repo, RequireIsolation: "chroot"}, false, nil, "chroot"},
		{"bad architecture", v1alpha1.ComputeContractSpec{RepoRef: repo, RequireArch: "x86_64"}, false, nil, "requireArch \"x86_64\""},
		{"no repo", v1alpha1.ComputeContractSpec{}, false, nil, "spec.repoRef"},
		{"the first fault is named", v1alpha1.ComputeContractSpec{Policy: "cheapest"}, false, nil, "unknown policy"},
	} {
		t.Run(c.name, func(t *testing.T) {
			obj := &v1alpha1.ComputeContract{Spec: c.spec}
			s, p, b, err := specState(obj, now, c.deleting)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one naming %q", err, c.err)
				}
				return
			}
			if err != nil || !c.check(s, p, b) {
				t.Fatalf("state %+v policy %s isolation %s err %v", s, p, b, err)
			}
		})
	}
}
