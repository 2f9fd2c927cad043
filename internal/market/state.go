package market

import "socialweb.computer/api/v1alpha1"

// Stage is where a contract stands in the market flow, read from what the requester holds:
// its phase, its own records (rfp, accept, delete), the receipt it has seen and whether a
// release was asked. The requester's controller runs one sub-step per stage; Next decides
// within it.
type Stage string

const (
	// StageFinal: Released or Failed; nothing more is written.
	StageFinal Stage = "Final"
	// StageReleasing: a release was asked (spec.release or deletion) of a contract not final.
	StageReleasing Stage = "Releasing"
	// StageUnpublished: no rfp written yet.
	StageUnpublished Stage = "Unpublished"
	// StageBidding: the rfp is out and no accept is written; the window is open or closes now.
	StageBidding Stage = "Bidding"
	// StageAccepted: our accept is written and no receipt binding it has come.
	StageAccepted Stage = "Accepted"
	// StageBound: the winner's receipt binds our accept; the guest is being readied or held.
	StageBound Stage = "Bound"
)

// StateOf is the stage of s. The order is the precedence: a final phase stays final, a
// release outranks every other stage, then the requester's own records in the order it
// writes them.
func StateOf(s State) Stage {
	switch {
	case s.Phase == v1alpha1.ComputeContractReleased || s.Phase == v1alpha1.ComputeContractFailed:
		return StageFinal
	case s.Release:
		return StageReleasing
	case s.RFPAt.IsZero():
		return StageUnpublished
	case s.Accept.URI == "":
		return StageBidding
	case s.Receipt == nil:
		return StageAccepted
	}
	return StageBound
}
