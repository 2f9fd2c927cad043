package image

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestLZ4Block(t *testing.T) {
	// "abcabcabcabc" + "xyz": literals "abc", match offset 3 length 9, then
	// last literals "xyz".
	blk := []byte{0x35, 'a', 'b', 'c', 3, 0, 0x30, 'x', 'y', 'z'}
	out, err := lz4Block(nil, blk)
	if err != nil || string(out) != "abcabcabcabcxyz" {
		t.Fatalf("%q %v", out, err)
	}
	if _, err := lz4Block(nil, []byte{0x10, 'a', 9, 0}); err == nil {
		t.Fatal("offset before the start accepted")
	}
}

// TestExtractVmlinux runs on the kernel of a built image when there is one
// ($SOCIALWEB_VM_IMAGE or .cache/vm-image).
func TestExtractVmlinux(t *testing.T) {
	dir := os.Getenv("SOCIALWEB_VM_IMAGE")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "..", ".cache", "vm-image")
	}
	bz, err := os.ReadFile(filepath.Join(dir, KernelFile))
	if err != nil {
		t.Skip("no built image; TestBuildImage covers the extraction")
	}
	out, err := ExtractVmlinux(bz)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(out, []byte("\x7fELF")) {
		t.Fatal("not an ELF")
	}
}
