// Command socialweb-cni-netpol is the node's chained CNI plugin that holds a new pod's
// sandbox until the node's NetworkPolicy rules know its addresses (internal/netpol/podgate),
// in a binary that links nothing of Kubernetes: the runtime starts it once per pod, and
// socialweb itself, under this name, takes tens of milliseconds more to start.
package main

import "socialweb.computer/internal/netpol/podgate"

func main() { podgate.PluginMain() }
