package atprotorepo

import (
	"errors"
	"fmt"
	"testing"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/repos"
)

func TestReadiness(t *testing.T) {
	rows := []struct {
		name   string
		err    error
		reason v1alpha1.ConditionReason
		retry  time.Duration
	}{
		{"refused password", fmt.Errorf("%w: xrpc 401 AuthenticationRequired", repos.ErrLoginFailed), v1alpha1.ReasonLoginFailed, unavailableRetry},
		{"network", fmt.Errorf("%w: dial tcp: connection refused", repos.ErrUnavailable), v1alpha1.ReasonUnreachable, unavailableRetry},
		{"unknown error", errors.New("boom"), v1alpha1.ReasonUnreachable, unavailableRetry},
	}
	for _, row := range rows {
		c, retry := readiness(3, nil, row.err)
		if c.Status != "False" || c.Reason != string(row.reason) || retry != row.retry || c.ObservedGeneration != 3 || c.Message != row.err.Error() {
			t.Errorf("%s: %+v retry %s, want False/%s retry %s", row.name, c, retry, row.reason, row.retry)
		}
	}
}
