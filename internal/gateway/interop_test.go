package gateway_test

import (
	"context"
	"testing"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/gateway"
	"socialweb.computer/internal/pds/refpds"
	"socialweb.computer/internal/testenv"
)

// A token minted by the reference PDS (@atproto/pds) is accepted, for its method only and
// once. Runs when CI=true or SOCIALWEB_INTEROP=1.
func TestInterop_ReferencePDSToken(t *testing.T) {
	peer := refpds.Require(t)
	env := testenv.Start(t, testenv.Options{})
	gw := startGatewayWith(t, env, peer.PLCURL)
	ctx := context.Background()
	c := atclient.New(peer.PDSURL)
	sess, err := c.CreateAccount(ctx, "gateway.test", "gateway-password", "gateway@example.test")
	if err != nil {
		t.Fatal(err)
	}
	tok := func(lxm string) string {
		s, err := c.GetServiceAuth(ctx, gw.DID(), lxm, 0)
		if err != nil {
			t.Fatalf("reference getServiceAuth: %v", err)
		}
		return s
	}
	create := tok(cluster.CreateClusterNSID)
	if got := call(t, gw, cluster.CreateClusterNSID, create, name{"ref1"}, nil); got != "" {
		t.Fatalf("createCluster with the reference PDS's token: %s", got)
	}
	if got := call(t, gw, cluster.CreateClusterNSID, create, name{"ref1"}, nil); got != gateway.ErrInvalidToken {
		t.Errorf("the same token again: %q, want InvalidToken", got)
	}
	if got := call(t, gw, cluster.DeleteClusterNSID, tok(cluster.ListClustersNSID), name{"ref1"}, nil); got != gateway.ErrInvalidToken {
		t.Errorf("a listClusters token for deleteCluster: %q, want InvalidToken", got)
	}
	var out cluster.ListClustersOutput
	if got := call(t, gw, cluster.ListClustersNSID, tok(cluster.ListClustersNSID), nil, &out); got != "" || len(out.Clusters) != 1 || out.Clusters[0].Name != "ref1" {
		t.Errorf("listClusters: %q %+v", got, out.Clusters)
	}
	var all v1alpha1.ClusterList
	var list []string
	if err := env.Client.List(ctx, &all); err == nil {
		for _, c := range all.Items {
			list = append(list, c.Namespace+"/"+c.Name+" "+c.Spec.Account)
		}
	}
	if want := gateway.AccountNamespace(sess.DID) + "/ref1 " + sess.DID; len(list) != 1 || list[0] != want {
		t.Errorf("Clusters %v, want %s", list, want)
	}
}
