package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

// An apiserver that does not answer is a NotReady the caller retries, never an internal
// error, and the message names no address of the host.
func TestTenantErr(t *testing.T) {
	cm := schema.GroupResource{Resource: "configmaps"}
	for _, tc := range []struct {
		name     string
		err      error
		wantName string
		wantMsg  string
	}{
		{"client timeout", &url.Error{Op: "Patch", URL: "https://127.0.0.1:41234/api/v1", Err: timeoutErr{}}, ErrClusterNotReady, "timed out"},
		{"refused", &url.Error{Op: "Get", URL: "https://127.0.0.1:41234/api", Err: errors.New("connect: connection refused")}, ErrClusterNotReady, "connection failed"},
		{"wrapped by discovery", fmt.Errorf("unable to retrieve the complete list: %w", &url.Error{Op: "Get", URL: "https://127.0.0.1:41234/apis", Err: timeoutErr{}}), ErrClusterNotReady, "timed out"},
		{"deadline", context.DeadlineExceeded, ErrClusterNotReady, "timed out"},
		{"forbidden", apierrors.NewForbidden(cm, "x", errors.New("no")), ErrForbidden, "forbidden"},
		{"conflict", apierrors.NewConflict(cm, "x", errors.New("field owned")), ErrApplyConflict, "field owned"},
		{"unavailable", apierrors.NewServiceUnavailable("starting"), ErrClusterNotReady, "starting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e *Error
			if !errors.As(tenantErr(tc.err), &e) {
				t.Fatalf("tenantErr(%v) = %v, want an *Error", tc.err, tenantErr(tc.err))
			}
			if e.Name != tc.wantName || !strings.Contains(e.Message, tc.wantMsg) {
				t.Errorf("tenantErr(%v) = %s %q, want %s with %q", tc.err, e.Name, e.Message, tc.wantName, tc.wantMsg)
			}
			if strings.Contains(e.Message, "127.0.0.1") {
				t.Errorf("message names the host's address: %q", e.Message)
			}
		})
	}
}
