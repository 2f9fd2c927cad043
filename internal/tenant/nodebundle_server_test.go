package tenant

import (
	"net"
	"testing"
)

func TestNodeServer(t *testing.T) {
	local := &Manager{}
	if got := local.nodeServer("https://127.0.0.1:41234"); got != "https://127.0.0.1:41234" {
		t.Errorf("no public address: %q, want the gate's loopback URL", got)
	}
	public := &Manager{cfg: Config{PublicAddress: net.ParseIP("198.51.100.7")}}
	if got := public.nodeServer("https://127.0.0.1:41234"); got != "https://198.51.100.7:41234" {
		t.Errorf("public address: %q, want the same port on it", got)
	}
}
