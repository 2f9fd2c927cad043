// Package vmtest gives the vm tests, and the end-to-end rows that boot vm guests, the image
// they boot.
package vmtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/substrate/vm/image"
)

// Image is the vm image dir the tests boot: $SOCIALWEB_VM_IMAGE, or .cache/vm-image in the
// module root (root is the path from the test's package dir to it), built there once per
// test process when it is missing or lacks the node modules. It skips (fails under CI) when
// qemu is missing or no image can be built.
func Image(t testing.TB, root string) string {
	t.Helper()
	_, qerr := exec.LookPath("qemu-system-x86_64")
	substratetest.Require(t, qerr == nil, "qemu-system-x86_64", "bash hack/install-guest-deps.sh")
	vmImageOnce.Do(func() {
		vmImageDir = os.Getenv("SOCIALWEB_VM_IMAGE")
		if vmImageDir == "" {
			wd, _ := os.Getwd()
			vmImageDir = filepath.Join(wd, root, ".cache", "vm-image")
		}
		if im, err := image.Load(vmImageDir); err == nil && im.Manifest.CarriesNodeModules() {
			return
		}
		if len(image.Prerequisites()) > 0 {
			vmImageErr = fmt.Errorf("no current image in %s and no apt/dpkg to build one", vmImageDir)
			return
		}
		vmImageErr = image.BuildImage(context.Background(), vmImageDir, os.Stderr)
	})
	substratetest.Require(t, vmImageErr == nil, "vm image", fmt.Sprint(vmImageErr))
	return vmImageDir
}

var (
	vmImageOnce sync.Once
	vmImageDir  string
	vmImageErr  error
)
