package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/substrate/vm"
	"socialweb.computer/internal/substrate/vm/vmtest"
	"socialweb.computer/internal/testenv"
)

// A contract for a vm guest is won by a bidder running qemu microVMs: Held once the guest's
// init has started, Released with no qemu left.
func TestACC_MarketVMGuest(t *testing.T) {
	env := marketEnv(t)
	b, dir := vmBidder(t, env)
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

// A vm guest's secretsRef reaches it through the market: the requester delivers it to the
// winner, which builds it into that guest's initramfs (/run/secrets/token); the guest prints
// its sha256 on the serial console, and the value is in no record.
func TestACC_MarketVMGuestSecrets(t *testing.T) {
	env := marketEnv(t)
	b, dir := vmBidder(t, env)
	value := fmt.Sprintf("vm-market-secret-%d", time.Now().UnixNano())
	newSecret(t, env, "vmapp", map[string][]byte{"token": []byte(value)})
	newContract(t, env, "vms", func(c *v1alpha1.ComputeContract) {
		c.Spec.ComputeKind = "vm"
		c.Spec.UserData = "echo \"secret $(sha256sum \"$SOCIALWEB_SECRETS_DIR/token\" | cut -d' ' -f1)\"\nsleep 1000\n"
		c.Spec.SecretsRef = &v1alpha1.SecretKeyRef{Name: "vmapp", Key: "token"}
	})
	var c v1alpha1.ComputeContract
	testenv.Eventually(t, 120*time.Second, "vms Held", func() (bool, error) {
		if err := env.Client.Get(context.Background(), key("vms"), &c); err != nil {
			return false, err
		}
		if c.Status.Phase == v1alpha1.ComputeContractFailed {
			t.Fatalf("Failed: %s", c.Status.Message)
		}
		return c.Status.Phase == v1alpha1.ComputeContractHeld, fmt.Errorf("%s: %s", c.Status.Phase, c.Status.Message)
	})
	sum := sha256.Sum256([]byte(value))
	want := "secret " + hex.EncodeToString(sum[:])
	testenv.Eventually(t, 60*time.Second, "the guest prints the secret's hash", func() (bool, error) {
		l := guestLog(t, b, c.Status.Accept)
		return strings.Contains(l, want), fmt.Errorf("serial log tail %q", tail(l, 400))
	})
	if l := guestLog(t, b, c.Status.Accept); strings.Contains(l, value) {
		t.Fatal("the secret value on the serial console")
	}
	if bytes.Contains(pdsBytes(t, env.PDS, env.Account.DID, b.DID()), []byte(value)) {
		t.Fatal("the secret value in a PDS record or frame")
	}
	release(t, env, "vms")
	waitContract(t, env, "vms", v1alpha1.ComputeContractReleased)
	waitNoProcs(t, dir)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// vmBidder runs a bidder on the vm substrate (qemu microVMs) for env, skipping the row when
// qemu or the image is missing outside CI.
func vmBidder(t *testing.T, env *testenv.Env) (*runningBidder, string) {
	t.Helper()
	img := vmImage(t)
	if _, err := env.PDS.CreateAccount(context.Background(), "vmbidder.test", "pw-vm"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "guests")
	sub, err := vm.New(vm.Config{StateDir: dir, ImageDir: img, Accelerator: os.Getenv("SOCIALWEB_VM_ACCEL")})
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, sub, dir)
	return runBidderOn(t, env, "vmbidder.test", 5, sub, dir), dir
}

// vmNodeRow skips a row that runs a Kubernetes node in a vm guest unless its guests boot
// under KVM or SOCIALWEB_E2E_EXTENDED=1 asks for it, and returns the image the row boots.
// Without KVM qemu emulates the CPU (TCG): such a row takes minutes of both the machine's
// cores, as much as a dozen other rows together, and the test command's budget cannot hold
// it (`bash hack/test.sh --extended` runs these rows). Whether guests get KVM is the
// substrate's own probe, a test boot: a host may have a /dev/kvm that opens and that its
// guests' kernel cannot boot under (a paravirtual KVM inside a VM). The vm guests of the
// market rows boot in seconds and always run.
func vmNodeRow(t *testing.T) string {
	t.Helper()
	const extended = "an extended row, run by SOCIALWEB_E2E_EXTENDED=1 (bash hack/test.sh --extended)"
	if os.Getenv("SOCIALWEB_E2E_EXTENDED") == "1" {
		return vmImage(t)
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("a vm node under TCG (no usable /dev/kvm: %v): %s", err, extended)
	}
	f.Close()
	img := vmImage(t)
	sub, err := vm.New(vm.Config{StateDir: t.TempDir(), ImageDir: img, Accelerator: os.Getenv("SOCIALWEB_VM_ACCEL")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	accel, err := sub.Accelerator(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if accel != vm.KVM {
		t.Skipf("a vm node under TCG (%s): %s", sub.AcceleratorReason(ctx), extended)
	}
	return img
}

// vmImage is the vm image the rows boot (vmtest.Image).
func vmImage(t *testing.T) string {
	t.Helper()
	return vmtest.Image(t, filepath.Join("..", ".."))
}
