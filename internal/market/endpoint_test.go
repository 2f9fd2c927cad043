package market

import "testing"

func TestPlainHTTPAllowed(t *testing.T) {
	for h, want := range map[string]bool{"127.0.0.1": true, "::1": true, "localhost": true, "127.8.9.1": true,
		"10.0.0.1": false, "example.com": false, "": false, "localhost.example.com": false, "0.0.0.0": false} {
		if PlainHTTPAllowed(h) != want {
			t.Errorf("PlainHTTPAllowed(%q) != %v", h, want)
		}
	}
}
