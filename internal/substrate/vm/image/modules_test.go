package image

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// moduleELF is a minimal ELF64 relocatable object whose .modinfo section holds fields, each
// NUL-terminated as the kernel's MODULE_INFO writes them.
func moduleELF(fields ...string) []byte {
	modinfo := []byte(strings.Join(fields, "\x00") + "\x00")
	shstrtab := []byte("\x00.modinfo\x00.shstrtab\x00")
	const ehsize, shentsize = 64, 64
	modOff := uint64(ehsize)
	strOff := modOff + uint64(len(modinfo))
	shOff := strOff + uint64(len(shstrtab))
	var b bytes.Buffer
	hdr := elf.Header64{
		Ident:     [16]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)},
		Type:      uint16(elf.ET_REL),
		Machine:   uint16(elf.EM_X86_64),
		Version:   uint32(elf.EV_CURRENT),
		Shoff:     shOff,
		Ehsize:    ehsize,
		Shentsize: shentsize,
		Shnum:     3,
		Shstrndx:  2,
	}
	_ = binary.Write(&b, binary.LittleEndian, hdr)
	b.Write(modinfo)
	b.Write(shstrtab)
	for _, sh := range []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_PROGBITS), Flags: uint64(elf.SHF_ALLOC), Off: modOff, Size: uint64(len(modinfo)), Addralign: 1},
		{Name: 10, Type: uint32(elf.SHT_STRTAB), Off: strOff, Size: uint64(len(shstrtab)), Addralign: 1},
	} {
		_ = binary.Write(&b, binary.LittleEndian, sh)
	}
	return b.Bytes()
}

func TestModuleDepends(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ko     []byte
		want   []string
		errHas string
	}{
		{name: "two", ko: moduleELF("license=GPL", "depends=nf_conntrack,nfnetlink", "name=nf_conntrack_netlink"), want: []string{"nf_conntrack", "nfnetlink"}},
		{name: "none", ko: moduleELF("license=GPL", "depends=", "name=nfnetlink")},
		{name: "no field", ko: moduleELF("license=GPL")},
		{name: "not elf", ko: []byte("ko"), errHas: "not a kernel module"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := moduleDepends(tc.ko)
			wantList(t, got, err, tc.want, tc.errHas)
		})
	}
}

func TestLoadOrder(t *testing.T) {
	deps := map[string][]string{
		"virtio_blk":     {"virtio", "virtio_ring"},
		"virtio":         {"virtio_ring"},
		"virtio_ring":    nil,
		"virtio_net":     {"net_failover", "virtio", "virtio_ring"},
		"net_failover":   {"failover"},
		"failover":       nil,
		"bridge":         {"stp", "llc"},
		"stp":            {"llc"},
		"llc":            nil,
		"br_netfilter":   {"bridge"},
		"nf_tables":      {"nfnetlink", "libcrc32c"},
		"nfnetlink":      nil,
		"libcrc32c":      nil,
		"nft_ct":         {"nf_tables", "nf_conntrack"},
		"nf_conntrack":   {"nf_defrag_ipv4", "nf_defrag_ipv6", "libcrc32c"},
		"nf_defrag_ipv4": nil,
		"nf_defrag_ipv6": nil,
		"a":              {"b"},
		"b":              {"a"},
	}
	depends := func(m string) ([]string, error) {
		d, ok := deps[m]
		if !ok {
			return nil, fmt.Errorf("%s.ko not found", m)
		}
		return d, nil
	}
	for _, tc := range []struct {
		name        string
		top, loaded []string
		want        []string
		errHas      string
	}{
		{
			name: "dependencies first, each once",
			top:  []string{"br_netfilter", "nft_ct", "nf_tables"},
			want: []string{"llc", "stp", "bridge", "br_netfilter", "nfnetlink", "libcrc32c", "nf_tables", "nf_defrag_ipv4", "nf_defrag_ipv6", "nf_conntrack", "nft_ct"},
		},
		{
			name:   "what init loads is left out, with what it depends on",
			top:    []string{"virtio_blk", "bridge"},
			loaded: []string{"virtio_ring", "virtio", "virtio_net"},
			want:   []string{"virtio_blk", "llc", "stp", "bridge"},
		},
		{name: "a top module init loads", top: []string{"virtio"}, loaded: []string{"virtio_net"}, want: nil},
		{name: "missing", top: []string{"nft_masq"}, errHas: "kernel module nft_masq: nft_masq.ko not found"},
		{name: "cycle", top: []string{"a"}, errHas: "a dependency cycle: a -> b -> a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := loadOrder(tc.top, tc.loaded, depends)
			wantList(t, got, err, tc.want, tc.errHas)
		})
	}
}

// wantList fails t unless err holds errHas (when set), or else got is want with no error.
func wantList(t *testing.T, got []string, err error, want []string, errHas string) {
	t.Helper()
	if errHas != "" {
		if err == nil || !strings.Contains(err.Error(), errHas) {
			t.Fatalf("err %v, want %q", err, errHas)
		}
		return
	}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("got %q, %v\nwant %q", got, err, want)
	}
}
