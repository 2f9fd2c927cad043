package plc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Client speaks plc.directory's HTTP API to any directory, this one or another.
type Client struct {
	URL  string // e.g. http://127.0.0.1:2582, no trailing slash
	HTTP *http.Client
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// Submit posts a signed operation for did.
func (c *Client) Submit(ctx context.Context, did string, op *Op) error {
	body, err := json.Marshal(op)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.URL, "/")+"/"+did, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return readErr(resp)
	}
	return nil
}

func readErr(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var m struct {
		Message string `json:"message"`
	}
	_ = json.Unmarshal(b, &m)
	if resp.StatusCode == 404 {
		return fmt.Errorf("%w: %s", ErrNotFound, m.Message)
	}
	if m.Message == "" {
		m.Message = strings.TrimSpace(string(b))
	}
	return &Error{Status: resp.StatusCode, Message: m.Message}
}

func (c *Client) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.URL, "/")+"/"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return readErr(resp)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v)
}

// Last fetches the newest operation of did.
func (c *Client) Last(ctx context.Context, did string) (*Op, error) {
	var op Op
	if err := c.get(ctx, did+"/log/last", &op); err != nil {
		return nil, err
	}
	return &op, nil
}

// Data fetches the current state of did.
func (c *Client) Data(ctx context.Context, did string) (*Data, error) {
	var d Data
	if err := c.get(ctx, did+"/data", &d); err != nil {
		return nil, err
	}
	return &d, nil
}
