package pds_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/pds"
)

// sendRaw writes head (and then body, in 64 KiB writes, unless the answer comes first) on a
// fresh connection to the PDS and returns the first response that is not 1xx, and whether a
// "100 Continue" came before it.
func sendRaw(t *testing.T, base, head string, body func(w io.Writer) error) (*http.Response, []byte, bool) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	if body != nil {
		// The server may answer and close before the body is all sent: write errors are the
		// point, not a failure.
		go func() { _ = body(conn) }()
	}
	br := bufio.NewReader(conn)
	continued := false
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if resp.StatusCode == http.StatusContinue {
			continued = true
			continue
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading the answer's body: %v", err)
		}
		return resp, b, continued
	}
}

func wantPayloadTooLarge(t *testing.T, resp *http.Response, b []byte) {
	t.Helper()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d %q, want 413", resp.StatusCode, b)
	}
	var e struct{ Error, Message string }
	if err := json.Unmarshal(b, &e); err != nil || e.Error != "PayloadTooLarge" || !strings.Contains(e.Message, fmt.Sprint(pds.MaxBodyBytes)) {
		t.Fatalf("body %q, want an XRPC error PayloadTooLarge naming the limit %d", b, pds.MaxBodyBytes)
	}
}

// A 50 MB putRecord announced with Expect: 100-continue is answered 413 with an XRPC error
// before the server says continue, and a chunked body past the limit gets the same answer.
func TestPDS_OversizedBodyIsPayloadTooLarge(t *testing.T) {
	s := startPDS(t, t.TempDir())
	defer s.Close()
	const path = "/xrpc/com.atproto.repo.putRecord"

	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", path, 50<<20)
	resp, b, continued := sendRaw(t, s.URL(), head, nil)
	if continued {
		t.Error("the server said 100 Continue to a body over its limit")
	}
	wantPayloadTooLarge(t, resp, b)

	head = fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n", path)
	resp, b, _ = sendRaw(t, s.URL(), head, func(w io.Writer) error {
		chunk := strings.Repeat("x", 64<<10)
		for range 64 { // 4 MiB
			if _, err := fmt.Fprintf(w, "%x\r\n%s\r\n", len(chunk), chunk); err != nil {
				return err
			}
		}
		_, err := io.WriteString(w, "0\r\n\r\n")
		return err
	})
	wantPayloadTooLarge(t, resp, b)
}
