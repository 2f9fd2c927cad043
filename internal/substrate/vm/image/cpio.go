package image

import (
	"compress/gzip"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Entry is one member of a newc cpio archive.
type Entry struct {
	Name     string // path inside the archive, without a leading slash
	Mode     uint32 // permission bits only; the type comes from Kind
	Kind     EntryKind
	Data     []byte // file contents
	Link     string // symlink target
	DevMajor uint32 // character devices
	DevMinor uint32
}

// EntryKind is the type of a cpio member.
type EntryKind int

const (
	File EntryKind = iota
	Dir
	Symlink
	CharDev
)

const (
	sIFREG = 0o100000
	sIFDIR = 0o040000
	sIFLNK = 0o120000
	sIFCHR = 0o020000
)

// Archive builds a newc ("070701") cpio archive, the format the Linux kernel
// unpacks as an initramfs. Every member is owned by uid 0, so the archive
// can be written without root and without an external cpio.
type Archive struct {
	entries map[string]Entry
}

// NewArchive returns an empty archive.
func NewArchive() *Archive { return &Archive{entries: map[string]Entry{}} }

// Add adds or replaces a member; parent directories are added as needed.
func (a *Archive) Add(e Entry) {
	e.Name = strings.Trim(e.Name, "/")
	if e.Name == "" {
		return
	}
	parts := strings.Split(e.Name, "/")
	for i := 1; i < len(parts); i++ {
		dir := strings.Join(parts[:i], "/")
		if _, ok := a.entries[dir]; !ok {
			a.entries[dir] = Entry{Name: dir, Kind: Dir, Mode: 0o755}
		}
	}
	a.entries[e.Name] = e
}

// WriteTo writes the archive, members in lexical order (so parents come
// before children), followed by the trailer.
func (a *Archive) WriteTo(w io.Writer) (int64, error) {
	names := make([]string, 0, len(a.entries))
	for n := range a.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	cw := &countWriter{w: w}
	ino := uint32(1)
	for _, n := range names {
		if err := writeEntry(cw, a.entries[n], ino); err != nil {
			return cw.n, err
		}
		ino++
	}
	if err := writeEntry(cw, Entry{Name: "TRAILER!!!", Kind: File}, 0); err != nil {
		return cw.n, err
	}
	return cw.n, nil
}

// WriteGzip writes the archive gzip-compressed.
func (a *Archive) WriteGzip(w io.Writer) error {
	zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	if _, err := a.WriteTo(zw); err != nil {
		return err
	}
	return zw.Close()
}

func writeEntry(w *countWriter, e Entry, ino uint32) error {
	var mode uint32
	var data []byte
	nlink := uint32(1)
	var rmaj, rmin uint32
	switch e.Kind {
	case File:
		mode = sIFREG | e.Mode&0o7777
		data = e.Data
	case Dir:
		mode = sIFDIR | e.Mode&0o7777
		nlink = 2
	case Symlink:
		mode = sIFLNK | 0o777
		data = []byte(e.Link)
	case CharDev:
		mode = sIFCHR | e.Mode&0o7777
		rmaj, rmin = e.DevMajor, e.DevMinor
	default:
		return fmt.Errorf("cpio: %s: unknown kind %d", e.Name, e.Kind)
	}
	if e.Name == "TRAILER!!!" {
		mode, nlink = 0, 1
	}
	name := e.Name + "\x00"
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmaj, rmin, len(name), 0)
	if _, err := io.WriteString(w, hdr+name); err != nil {
		return err
	}
	if err := w.pad4(); err != nil {
		return err
	}
	if _, err := w.Write(data); err != nil {
		return err
	}
	return w.pad4()
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (c *countWriter) pad4() error {
	if r := c.n % 4; r != 0 {
		_, err := c.Write(make([]byte, 4-r))
		return err
	}
	return nil
}
