package infra

import "socialweb.computer/api/v1alpha1"

// PublishedSpec is what a deployment bound with sync Publish shows in its record: every
// contract's name, state, vmName, computeKind, bidder lists, ports and release time, without
// userData, policy, policyArgs, sshAuthorizedKeys and vmReadyTimeoutSec (the guest's inputs
// and the market's knobs are the deployment's business, and a published record is only a
// view: it is never pulled back). spec.secrets, spec.nodes, spec.clusterRef and spec.record
// never reach any record (RenderRecord). The declaration hash of a Publish binding is taken
// over this projection on both sides, so the record holding it is in sync.
func PublishedSpec(spec v1alpha1.InfraSpec) v1alpha1.InfraSpec {
	out := *spec.DeepCopy()
	for i := range out.Contracts {
		c := &out.Contracts[i]
		c.UserData, c.Policy, c.PolicyArgs, c.SSHAuthorizedKeys, c.VMReadyTimeoutSec = "", "", nil, nil, nil
	}
	return out
}

// PublishedStatus is the observed status a Publish record shows: phases, winners and
// receipts, without the contracts' messages (a bidder's or the market's words about a
// failure may name hosts or inputs).
func PublishedStatus(st v1alpha1.EphemeralInfraStatus) v1alpha1.EphemeralInfraStatus {
	out := *st.DeepCopy()
	for i := range out.Contracts {
		out.Contracts[i].Message = ""
	}
	return out
}
