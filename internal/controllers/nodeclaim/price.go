package nodeclaim

import (
	"strconv"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// winningPrice is what the contract's winning bid costs, per hour: the bid of the winner
// among the bids seen (a bidder bids once on an rfp). Nil while no bid has won, or when the
// winner's bid is not among them or states no readable cost.
func winningPrice(st *v1alpha1.ComputeContractStatus) *v1alpha1.NodeClaimPrice {
	if st == nil || st.Winner == "" {
		return nil
	}
	for _, b := range st.Bids {
		if b.Bidder != st.Winner || b.Refused != "" {
			continue
		}
		cost, err := strconv.ParseInt(b.Cost, 10, 64)
		if err != nil || cost < 0 {
			return nil
		}
		return &v1alpha1.NodeClaimPrice{Cost: cost, Currency: b.Currency}
	}
	return nil
}

// priceCap is the cap on the claim's winning bid: the claim's own maxPrice (a replacement
// node's, below what the nodes it replaces cost), unless the Cluster's nodeMaxPrice is
// lower in the same currency; the Cluster's when the claim has none.
func priceCap(cluster *v1alpha1.Cluster, claim *v1alpha1.NodeClaim) *v1alpha1.NodePrice {
	var fromCluster *v1alpha1.NodePrice
	if cluster != nil {
		fromCluster = cluster.Spec.NodeMaxPrice
	}
	own := claim.Spec.MaxPrice
	switch {
	case own == nil:
		return fromCluster
	case fromCluster != nil && fromCluster.Currency == own.Currency && fromCluster.Cost < own.Cost:
		return fromCluster
	}
	return own
}
