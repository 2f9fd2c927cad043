package pds

import (
	"bytes"
	"encoding/binary"
)

// sniffLen is how much of an upload is looked at to tell its type.
const sniffLen = 4100

// sniffMime tells a blob's type from its first bytes, by the magic numbers of the formats
// people upload (images, audio, video, documents, archives), naming them as the reference
// PDS's sniffer (the file-type package) does. "" means unknown: the declared type is used,
// as the reference does. Text formats are never sniffed, so HTML declared as text/plain
// stays text/plain.
func sniffMime(b []byte) string {
	has := func(off int, sig string) bool {
		return len(b) >= off+len(sig) && string(b[off:off+len(sig)]) == sig
	}
	switch {
	case has(0, "\x89PNG\r\n\x1a\n"):
		return sniffPNG(b)
	case has(0, "\xff\xd8\xff"):
		return "image/jpeg"
	case has(0, "GIF87a"), has(0, "GIF89a"):
		return "image/gif"
	case has(0, "RIFF") && has(8, "WEBP"):
		return "image/webp"
	case has(0, "RIFF") && has(8, "WAVE"):
		return "audio/wav"
	case has(0, "RIFF") && has(8, "AVI "):
		return "video/vnd.avi"
	case has(4, "ftyp") && len(b) >= 12:
		return sniffFtyp(string(bytes.TrimRight(b[8:12], "\x00 ")))
	case has(0, "\x1a\x45\xdf\xa3"):
		if bytes.Contains(b[:min(len(b), 64)], []byte("webm")) {
			return "video/webm"
		}
		return "video/matroska"
	case has(0, "%PDF"):
		return "application/pdf"
	case has(0, "\x1f\x8b\x08"):
		return "application/gzip"
	case has(0, "fLaC"):
		return "audio/flac"
	case has(0, "ID3") && len(b) >= 10:
		// An ID3 tag comes before the audio; its length is four 7-bit bytes.
		n := int(b[6]&0x7f)<<21 | int(b[7]&0x7f)<<14 | int(b[8]&0x7f)<<7 | int(b[9]&0x7f)
		if 10+n < len(b) {
			return sniffMime(b[10+n:])
		}
		return ""
	case has(0, "OggS") && has(28, "OpusHead"):
		return "audio/ogg; codecs=opus"
	case has(0, "OggS") && has(28, "\x01vorbis"):
		return "audio/ogg"
	case has(0, "II*\x00"), has(0, "MM\x00*"):
		return "image/tiff"
	case has(0, "BM") && len(b) >= 14:
		return "image/bmp"
	case has(0, "\x00\x00\x01\x00") && len(b) >= 6:
		return "image/x-icon"
	}
	return ""
}

// sniffPNG tells an animated PNG (an acTL chunk before the first IDAT) from a still one.
func sniffPNG(b []byte) string {
	for off := 8; off+8 <= len(b); {
		n := int(binary.BigEndian.Uint32(b[off:]))
		switch string(b[off+4 : off+8]) {
		case "acTL":
			return "image/apng"
		case "IDAT", "IEND":
			return "image/png"
		}
		if n < 0 || off+12+n < off {
			break
		}
		off += 12 + n
	}
	return "image/png"
}

// sniffFtyp names an ISO base media file (MP4 and kin) by its major brand.
func sniffFtyp(brand string) string {
	switch brand {
	case "avif", "avis":
		return "image/avif"
	case "heic", "heix":
		return "image/heic"
	case "hevc", "hevx":
		return "image/heic-sequence"
	case "mif1":
		return "image/heif"
	case "msf1":
		return "image/heif-sequence"
	case "qt":
		return "video/quicktime"
	case "M4A":
		return "audio/x-m4a"
	case "M4V", "M4VH", "M4VP":
		return "video/x-m4v"
	case "M4P":
		return "video/mp4"
	case "M4B":
		return "audio/mp4"
	case "F4V":
		return "video/mp4"
	case "crx":
		return "image/x-canon-cr3"
	}
	if len(brand) >= 3 && brand[:3] == "3g2" {
		return "video/3gpp2"
	}
	if len(brand) >= 2 && brand[:2] == "3g" {
		return "video/3gpp"
	}
	return "video/mp4"
}
