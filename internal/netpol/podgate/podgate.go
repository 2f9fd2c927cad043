// Package podgate closes the window in which a new pod runs before its node's NetworkPolicy
// rules know its address.
//
// The node's rules (internal/netpol) key every isolated pod by its address. Learnt from the
// apiserver, that address arrives after the pod's containers have started: the kubelet
// reports it once the sandbox is up, and the node's informer sees it tens of milliseconds
// later (more under load), so a pod isolated for egress could send, and one isolated for
// ingress be reached, before its rules held. The gate is a chained CNI plugin (after the
// bridge plugin, which assigns the address): on ADD it tells the node's enforcement process
// the pod's UID and addresses over a unix socket and waits until the rules written include
// them. The sandbox, and so every container of the pod, starts only then. Cilium's CNI ADD
// waits for its endpoint's policy the same way.
//
// When the enforcement process cannot be reached, or does not answer within the timeout,
// ADD fails: the kubelet tries the sandbox again later, and the pod does not run unenforced.
//
// This package is what the plugin links (the small cmd/socialweb-cni-netpol, or socialweb
// itself under the plugin's name): the CNI library and the request, nothing of Kubernetes.
package podgate

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// PluginName is the plugin's type in a CNI config, and the name of its binary.
const PluginName = "socialweb-cni-netpol"

// DefaultTimeout is how long ADD waits for the rules when the config sets none.
const DefaultTimeout = 20 * time.Second

// Request is what the plugin sends: one JSON object on one line.
type Request struct {
	UID       string       `json:"uid"`
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	IPs       []netip.Addr `json:"ips"`
}

// Response is the enforcement process's answer: empty Error once the rules that include the
// pod's addresses are written.
type Response struct {
	Error string `json:"error,omitempty"`
}

// Config is the plugin's entry in the CNI config list.
type Config struct {
	types.PluginConf
	// Socket is the enforcement process's unix socket (`socialweb kube netpol --gate-socket`).
	Socket string `json:"socket"`
	// Timeout bounds the wait for the rules ("20s"; DefaultTimeout when empty).
	Timeout string `json:"timeout,omitempty"`
}

// k8sArgs are the CNI_ARGS the kubelet's runtime passes for a pod.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE types.UnmarshallableString //nolint:revive // the runtime's name
	K8S_POD_NAME      types.UnmarshallableString //nolint:revive
	K8S_POD_UID       types.UnmarshallableString //nolint:revive
}

// IsPlugin says whether this process was started as the plugin (by its name).
func IsPlugin() bool { return filepath.Base(os.Args[0]) == PluginName }

// PluginMain runs the plugin: the CNI command from the environment, the config on stdin.
func PluginMain() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: passDel, Check: check},
		version.PluginSupports("0.4.0", "1.0.0", "1.1.0"),
		"holds a pod's sandbox until its node's NetworkPolicy rules know its addresses")
}

// add asks the enforcement process to know the pod's addresses and waits for it, then
// passes the previous plugin's result on unchanged.
func add(args *skel.CmdArgs) error {
	conf, req, timeout, err := parse(args)
	if err != nil {
		return err
	}
	if err := Ask(conf.Socket, req, timeout); err != nil {
		return err
	}
	return types.PrintResult(conf.PrevResult, conf.CNIVersion)
}

// parse reads the config, the previous result's addresses and the pod's identity.
func parse(args *skel.CmdArgs) (Config, Request, time.Duration, error) {
	var conf Config
	if err := json.Unmarshal(args.StdinData, &conf); err != nil {
		return conf, Request{}, 0, fmt.Errorf("%s: config: %w", PluginName, err)
	}
	if conf.Socket == "" {
		return conf, Request{}, 0, fmt.Errorf("%s: config names no socket", PluginName)
	}
	timeout := DefaultTimeout
	if conf.Timeout != "" {
		d, err := time.ParseDuration(conf.Timeout)
		if err != nil || d <= 0 {
			return conf, Request{}, 0, fmt.Errorf("%s: timeout %q: want a positive duration", PluginName, conf.Timeout)
		}
		timeout = d
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return conf, Request{}, 0, fmt.Errorf("%s: prevResult: %w", PluginName, err)
	}
	if conf.PrevResult == nil {
		return conf, Request{}, 0, fmt.Errorf("%s: no prevResult: it must follow the plugin that assigns the pod's address", PluginName)
	}
	res, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return conf, Request{}, 0, fmt.Errorf("%s: prevResult: %w", PluginName, err)
	}
	var ka k8sArgs
	ka.IgnoreUnknown = true
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return conf, Request{}, 0, fmt.Errorf("%s: CNI_ARGS: %w", PluginName, err)
	}
	req := Request{UID: string(ka.K8S_POD_UID), Namespace: string(ka.K8S_POD_NAMESPACE), Name: string(ka.K8S_POD_NAME)}
	if req.UID == "" {
		return conf, Request{}, 0, fmt.Errorf("%s: CNI_ARGS carry no K8S_POD_UID (the runtime must pass the pod's identity)", PluginName)
	}
	for _, ip := range res.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
			req.IPs = append(req.IPs, a.Unmap())
		}
	}
	if len(req.IPs) == 0 {
		return conf, Request{}, 0, fmt.Errorf("%s: prevResult has no address for the pod", PluginName)
	}
	return conf, req, timeout, nil
}

// Ask sends req to the enforcement process at socket and waits for its answer, connecting
// again while the socket is not there yet (the process starts after the kubelet, and
// restarts), all within timeout.
func Ask(socket string, req Request, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		c, err := net.DialTimeout("unix", socket, time.Until(deadline))
		if err == nil {
			err = ask(c, req, deadline)
			if err == nil {
				return nil
			}
			var refused *refusedError
			if errors.As(err, &refused) {
				return err
			}
		}
		last = err
		if time.Now().Add(50 * time.Millisecond).After(deadline) {
			return fmt.Errorf("%s: pod %s/%s: the node's NetworkPolicy rules did not take its addresses within %v (see the node's netpol.log): %v",
				PluginName, req.Namespace, req.Name, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// refusedError is an answer that says no: asking again does not help.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

func ask(c net.Conn, req Request, deadline time.Time) error {
	defer c.Close()
	if err := c.SetDeadline(deadline); err != nil {
		return err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := c.Write(append(b, '\n')); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return fmt.Errorf("answer %q: %w", line, err)
	}
	if resp.Error != "" {
		return &refusedError{fmt.Sprintf("%s: pod %s/%s: %s", PluginName, req.Namespace, req.Name, resp.Error)}
	}
	return nil
}

// passDel: nothing to undo. The enforcement process forgets a pod's addresses when the pod
// is gone.
func passDel(*skel.CmdArgs) error { return nil }

// check passes when the config is valid: the rules themselves are the enforcement process's
// to keep.
func check(args *skel.CmdArgs) error {
	_, _, _, err := parse(args)
	return err
}
