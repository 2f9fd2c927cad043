package pds

import (
	"testing"

	"socialweb.computer/internal/xrpc"
)

func TestNormalizeHandle(t *testing.T) {
	s := &Server{cfg: Config{UserDomains: []string{".test"}}}
	for _, tc := range []struct {
		in, want string
		own      bool
		errName  string
	}{
		{"Gina.TEST", "gina.test", true, ""},
		{"gina.example.com", "gina.example.com", false, ""},
		{"not a handle", "", false, xrpc.InvalidRequest},
		{"gina.invalid", "", false, "InvalidHandle"},
		{"gina.onion", "", false, "InvalidHandle"},
		{"gi.test", "", false, "InvalidHandle"},
		{"a.b.test", "", false, "InvalidHandle"},
		{"abcdefghijklmnopqrstuvwxyz.test", "", false, "InvalidHandle"},
		{"admin.test", "", false, "HandleNotAvailable"},
		{"bsky.test", "", false, "HandleNotAvailable"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, own, err := s.normalizeHandle(tc.in, false)
			name := ""
			if xe, ok := err.(*XRPCError); ok {
				name = xe.Name
			} else if err != nil {
				t.Fatalf("untyped error %v", err)
			}
			if tc.errName == "HandleNotAvailable" {
				if _, _, err := s.normalizeHandle(tc.in, true); err != nil {
					t.Fatalf("allowReserved: %v", err)
				}
			}
			if got != tc.want || own != tc.own || name != tc.errName {
				t.Fatalf("normalizeHandle(%q) = %q, %v, %q; want %q, %v, %q", tc.in, got, own, name, tc.want, tc.own, tc.errName)
			}
		})
	}
}
