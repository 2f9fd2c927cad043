package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/substrate/vm"
	"socialweb.computer/internal/substrate/vm/image"
	"socialweb.computer/internal/testenv"
)

// A contract for a vm guest is won by a bidder running qemu microVMs: Held once the guest's
// init has started, Released with no qemu left.
func TestACC_MarketVMGuest(t *testing.T) {
	_, qerr := exec.LookPath("qemu-system-x86_64")
	substratetest.Require(t, qerr == nil, "qemu-system-x86_64", "bash hack/install-guest-deps.sh")
	img := os.Getenv("SOCIALWEB_VM_IMAGE")
	if img == "" {
		wd, _ := os.Getwd()
		img = filepath.Join(wd, "..", "..", ".cache", "vm-image")
	}
	if _, err := image.Load(img); err != nil {
		if len(image.Prerequisites()) > 0 {
			substratetest.Require(t, false, "vm image", err.Error())
		}
		if err := image.BuildImage(context.Background(), img, os.Stderr); err != nil {
			substratetest.Require(t, false, "vm image", err.Error())
		}
	}
	env := marketEnv(t)
	if _, err := env.PDS.CreateAccount(context.Background(), "vmbidder.test", "pw-vm"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "guests")
	sub, err := vm.New(vm.Config{StateDir: dir, ImageDir: img, Accelerator: os.Getenv("SOCIALWEB_VM_ACCEL")})
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, sub, dir)
	b := runBidderOn(t, env, "vmbidder.test", 5, sub, dir)
	newContract(t, env, "vm1", func(c *v1alpha1.ComputeContract) {
		c.Spec.ComputeKind = "vm"
		c.Spec.UserData = "echo hello from the market\nsleep 1000\n"
	})
	var c v1alpha1.ComputeContract
	// Under TCG on a loaded 2-core host a boot has taken 15-20 s (docs/substrates.md).
	testenv.Eventually(t, 120*time.Second, "vm1 Held", func() (bool, error) {
		if err := env.Client.Get(context.Background(), key("vm1"), &c); err != nil {
			return false, err
		}
		if c.Status.Phase == v1alpha1.ComputeContractFailed {
			t.Fatalf("Failed: %s", c.Status.Message)
		}
		return c.Status.Phase == v1alpha1.ComputeContractHeld, fmt.Errorf("%s: %s", c.Status.Phase, c.Status.Message)
	})
	if c.Status.Winner != b.DID() {
		t.Fatalf("winner %s", c.Status.Winner)
	}
	release(t, env, "vm1")
	waitContract(t, env, "vm1", v1alpha1.ComputeContractReleased)
	waitNoProcs(t, dir)
}
