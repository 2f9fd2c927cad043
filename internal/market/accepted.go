package market

import (
	"fmt"
	"strings"
)

// AcceptedBid is the bid a contract's accept names, given the accept record found in the
// repo (writtenBid: its bid's URI and CID) and the winner this round chose. The accept is
// written once at a key derived from the contract (feed.PutOnce), so a round that runs after
// a crash between the accept's write and the status that names it finds the first accept
// instead of writing its own. The winner is the one that accept names, whatever this round
// would choose now: a bid that came in since (a late bid, a bidder's replay) may rank first
// today, but its bidder was never accepted, and the bidder that was is the one that boots
// the guest and writes the receipt. The bid is taken from bids when known there, else its
// bidder is the DID of its URI.
func AcceptedBid(writtenURI, writtenCID string, chosen Bid, bids []Bid) (Bid, error) {
	if writtenURI == "" || writtenURI == chosen.URI {
		return chosen, nil
	}
	for _, b := range bids {
		if b.URI == writtenURI {
			return b, nil
		}
	}
	rest, ok := strings.CutPrefix(writtenURI, "at://")
	did, _, _ := strings.Cut(rest, "/")
	if !ok || !strings.HasPrefix(did, "did:") {
		return Bid{}, fmt.Errorf("the accept in the repo names bid %q, which is not an at-uri of a DID's record", writtenURI)
	}
	return Bid{URI: writtenURI, CID: writtenCID, Bidder: did}, nil
}
