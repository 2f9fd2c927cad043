package podgate

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
)

// conf is the plugin's entry as libcni hands it over: the list's version and name, and the
// bridge plugin's result as prevResult.
const conf = `{"cniVersion":"1.0.0","name":"socialweb-node","type":"socialweb-cni-netpol","socket":"/run/x.sock","timeout":"3s",
"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"cni0"},{"name":"eth0","sandbox":"/var/run/netns/x"}],
"ips":[{"interface":1,"address":"10.42.3.7/24","gateway":"10.42.3.1"}],"routes":[{"dst":"0.0.0.0/0"}]}}`

const k8s = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=1234-5678"

func TestParse(t *testing.T) {
	_, req, timeout, err := parse(&skel.CmdArgs{StdinData: []byte(conf), Args: k8s})
	if err != nil {
		t.Fatal(err)
	}
	want := Request{UID: "1234-5678", Namespace: "default", Name: "web", IPs: []netip.Addr{netip.MustParseAddr("10.42.3.7")}}
	if req.UID != want.UID || req.Namespace != want.Namespace || req.Name != want.Name || !slices.Equal(req.IPs, want.IPs) || timeout != 3*time.Second {
		t.Fatalf("parse = %+v, %v; want %+v, 3s", req, timeout, want)
	}
	for _, tc := range []struct{ name, conf, args, want string }{
		{"no socket", strings.Replace(conf, `"socket":"/run/x.sock",`, "", 1), k8s, "no socket"},
		{"bad timeout", strings.Replace(conf, `"3s"`, `"-1s"`, 1), k8s, "timeout"},
		{"first in the list", strings.Split(conf, `,
"prevResult"`)[0] + "}", k8s, "no prevResult"},
		{"no pod identity", conf, "IgnoreUnknown=1;K8S_POD_NAMESPACE=default", "K8S_POD_UID"},
		{"no address", strings.Replace(conf, `{"interface":1,"address":"10.42.3.7/24","gateway":"10.42.3.1"}`, "", 1), k8s, "no address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := parse(&skel.CmdArgs{StdinData: []byte(tc.conf), Args: tc.args})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// ADD passes the bridge plugin's result on unchanged (libcni hands it to the runtime).
func TestAddPrintsThePreviousResult(t *testing.T) {
	srv := serveOnce(t, Response{})
	c := strings.Replace(conf, "/run/x.sock", srv, 1)
	out := captureStdout(t, func() error { return add(&skel.CmdArgs{StdinData: []byte(c), Args: k8s}) })
	var got struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &got); err != nil || len(got.IPs) != 1 || got.IPs[0].Address != "10.42.3.7/24" {
		t.Fatalf("printed %s (%v), want the previous result with 10.42.3.7/24", out, err)
	}
}

func serveOnce(t *testing.T, resp Response) string {
	t.Helper()
	sock := t.TempDir() + "/gate.sock"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		_, _ = c.Read(buf)
		b, _ := json.Marshal(resp)
		_, _ = c.Write(append(b, '\n'))
	}()
	return sock
}

func captureStdout(t *testing.T, f func() error) []byte {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	ferr := f()
	os.Stdout = old
	w.Close()
	var b bytes.Buffer
	_, _ = io.Copy(&b, r)
	if ferr != nil {
		t.Fatal(ferr)
	}
	return b.Bytes()
}
