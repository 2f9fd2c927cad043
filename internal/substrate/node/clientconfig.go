package node

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The node's processes beside the kubelet (the NetworkPolicy engine, and whatever else
// talks to the apiserver as the node) use the kubelet's own client certificate, which the
// kubelet renews through CertificateSigningRequests: the join bundle's lives a day. The
// kubelet keeps the current pair in its cert dir as kubelet-client-current.pem (written from
// the bundle at its start, replaced at each renewal); the client kubeconfig names that file,
// and client-go reloads it when it changes.

// clientPairFile is the kubelet's current client certificate and key (one PEM file).
func (ns nodeState) clientPairFile() string {
	return ns.work("kubelet", "pki", "kubelet-client-current.pem")
}

// clientKubeconfig is the kubeconfig of the node's other processes.
func (ns nodeState) clientKubeconfig() string { return ns.work("kubelet", "client.kubeconfig") }

// writeClientKubeconfig writes clientKubeconfig: the bundle kubeconfig's server and CA, the
// kubelet's current pair as the credential.
func writeClientKubeconfig(ns nodeState) error {
	bundle, err := clientcmd.LoadFromFile(ns.secret(SecretKubeconfig))
	if err != nil {
		return fmt.Errorf("the join bundle's kubeconfig: %w", err)
	}
	ctx := bundle.Contexts[bundle.CurrentContext]
	if ctx == nil || bundle.Clusters[ctx.Cluster] == nil {
		return fmt.Errorf("the join bundle's kubeconfig has no current context with a cluster")
	}
	cl := bundle.Clusters[ctx.Cluster]
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["node"] = &clientcmdapi.Cluster{Server: cl.Server, CertificateAuthorityData: cl.CertificateAuthorityData, CertificateAuthority: cl.CertificateAuthority}
	cfg.AuthInfos["node"] = &clientcmdapi.AuthInfo{ClientCertificate: ns.clientPairFile(), ClientKey: ns.clientPairFile()}
	cfg.Contexts["node"] = &clientcmdapi.Context{Cluster: "node", AuthInfo: "node"}
	cfg.CurrentContext = "node"
	if err := os.MkdirAll(filepath.Dir(ns.clientKubeconfig()), 0o700); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*cfg, ns.clientKubeconfig())
}

// waitClientPair waits for the kubelet to write its current pair.
func waitClientPair(ns nodeState, d time.Duration) error {
	if err := waitFor(d, func() bool { _, err := os.Stat(ns.clientPairFile()); return err == nil }); err != nil {
		return fmt.Errorf("the kubelet wrote no client certificate (%s) within %v (see kubelet.log)", ns.clientPairFile(), d)
	}
	return nil
}
