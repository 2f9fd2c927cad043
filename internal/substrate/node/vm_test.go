package node

import (
	"errors"
	"net"
	"strings"
	"testing"

	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/vm/image"
)

// Each vm node's /29 holds the host's end, the guest and the bridge, and no two nodes share
// an address.
func TestVMAddrs(t *testing.T) {
	for _, c := range []struct {
		i                  int
		host, node, bridge string
	}{
		{1, "10.79.0.9", "10.79.0.10", "10.79.0.11"},
		{31, "10.79.0.249", "10.79.0.250", "10.79.0.251"},
		{32, "10.79.1.1", "10.79.1.2", "10.79.1.3"},
		{maxNodes - 1, "10.79.127.249", "10.79.127.250", "10.79.127.251"},
	} {
		h, n, b := vmAddrs(c.i)
		if h != c.host || n != c.node || b != c.bridge {
			t.Errorf("vmAddrs(%d) = %s %s %s, want %s %s %s", c.i, h, n, b, c.host, c.node, c.bridge)
		}
	}
	seen := map[string]int{}
	for i := 1; i < maxNodes; i++ {
		h, n, b := vmAddrs(i)
		_, block, _ := net.ParseCIDR(h + "/29")
		for _, a := range []string{h, n, b} {
			if j, ok := seen[a]; ok {
				t.Fatalf("%s given to nodes %d and %d", a, j, i)
			}
			seen[a] = i
			if !block.Contains(net.ParseIP(a)) || a == block.IP.String() {
				t.Fatalf("node %d: %s outside its /29 %s or its network address", i, a, block)
			}
		}
	}
}

// The guest loads the image's node modules in their order, finds its disks by label and
// mounts the state disk as /var/lib, takes the addresses the host configured, and moves the
// root disk over / before it becomes the agent.
func TestVMBootScript(t *testing.T) {
	h, n, b := vmAddrs(3)
	s := vmBootScript(nodeState{HostIP: h, NodeIP: n, BridgeIP: b})
	for _, want := range []string{
		"findfs LABEL=" + rootDiskLabel, "findfs LABEL=" + stateDiskLabel,
		`mount -t ext4 -o ro "$root" /node`, `mount -t ext4 "$state" /node/var/lib`,
		"ip addr add " + n + "/29 dev eth0", "ip route add default via " + h,
		"cd /node\nmount --move . /\nexec chroot . " + guestBinary + " node-agent " + guestStateDir + "/node",
		"for m in $(cat /" + image.NodeModuleOrderFile + "); do insmod /lib/modules/$m.ko; done",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("boot script lacks %q:\n%s", want, s)
		}
	}
}

func TestNewRefusesUnknownFlavour(t *testing.T) {
	_, err := New(Config{StateDir: t.TempDir(), Binary: "/bin/true", Flavour: "kvm"})
	if !errors.Is(err, substrate.ErrInvalidSpec) || !strings.Contains(err.Error(), "want namespace, vm or auto") {
		t.Fatalf("flavour kvm: %v, want ErrInvalidSpec naming the flavours", err)
	}
}

func TestChooseFlavour(t *testing.T) {
	noImage := errors.New("no vm image in /x")
	for _, c := range []struct {
		name          string
		vmErr         error
		accel, reason string
		want          string
		says          string
	}{
		{"no image", noImage, "", "", FlavourNamespace, "no vm image in /x"},
		{"tcg only", nil, "tcg", "no usable /dev/kvm", FlavourNamespace, "under tcg (no usable /dev/kvm)"},
		{"kvm", nil, "kvm", "a test boot under kvm reached init in 80 ms", FlavourVM, "under kvm"},
		// An image error wins over whatever the accelerator would be.
		{"image error and kvm", noImage, "kvm", "", FlavourNamespace, "no vm nodes"},
	} {
		got, why := chooseFlavour(c.vmErr, c.accel, c.reason)
		if got != c.want || !strings.Contains(why, c.says) {
			t.Errorf("%s: %s %q, want %s and a reason with %q", c.name, got, why, c.want, c.says)
		}
	}
}
