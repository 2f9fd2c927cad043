package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"socialweb.computer/internal/xrpc"
)

// Call calls a gateway method at base with a service-auth token: a procedure (POST) when in
// is not nil, else a query. An XRPC error answer is returned as an *Error.
func Call(ctx context.Context, base, nsid, token string, in, out any) error {
	method, body := http.MethodGet, io.Reader(nil)
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		method, body = http.MethodPost, bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(base, "/")+"/xrpc/"+nsid, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		xe, ok := xrpc.Decode(resp.StatusCode, resp.Header, raw)
		if !ok {
			return fmt.Errorf("%s: HTTP %d: %.200s", nsid, resp.StatusCode, raw)
		}
		return xe
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(raw, out)
}
