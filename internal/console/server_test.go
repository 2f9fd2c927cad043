package console

import (
	"net/http"
	"strings"
	"testing"
)

func TestSSEEvent(t *testing.T) {
	for _, tc := range []struct{ data, want string }{
		{"<p>a</p>", "event: view\ndata: <p>a</p>\n\n"},
		{"a\nb", "event: view\ndata: a\ndata: b\n\n"},
		// A CR would end a line for the browser's parser: a value holding
		// "\revent: x" must stay inside a data field.
		{"a\r\nb\revent: x", "event: view\ndata: a\ndata: b\ndata: event: x\n\n"},
	} {
		if got := string(sseEvent("view", []byte(tc.data))); got != tc.want {
			t.Errorf("sseEvent(%q) = %q, want %q", tc.data, got, tc.want)
		}
	}
}

func TestSameOrigin(t *testing.T) {
	hosts := []string{"127.0.0.1:8080", "localhost:8080"}
	for _, tc := range []struct {
		name          string
		origin, fetch string
		want          bool
	}{
		{"own origin", "http://127.0.0.1:8080", "", true},
		{"localhost", "http://localhost:8080", "", true},
		{"another port", "http://127.0.0.1:9090", "", false},
		{"another site", "http://evil.test", "same-origin", false},
		{"https is another origin", "https://127.0.0.1:8080", "", false},
		{"null origin", "null", "", false},
		{"no origin, same-origin fetch", "", "same-origin", true},
		{"no origin, cross-site fetch", "", "cross-site", false},
		{"neither", "", "", false},
	} {
		r, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:8080/login", strings.NewReader(""))
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if tc.fetch != "" {
			r.Header.Set("Sec-Fetch-Site", tc.fetch)
		}
		if got := sameOrigin(r, hosts); got != tc.want {
			t.Errorf("%s: sameOrigin = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestHostAllowed(t *testing.T) {
	hosts := []string{"127.0.0.1:8080", "localhost:8080"}
	for host, want := range map[string]bool{"127.0.0.1:8080": true, "LOCALHOST:8080": true, "evil.test:8080": false,
		"127.0.0.1": false, "127.0.0.1:8081": false, "": false} {
		if got := hostAllowed(host, hosts); got != want {
			t.Errorf("hostAllowed(%q) = %v, want %v", host, got, want)
		}
	}
}
