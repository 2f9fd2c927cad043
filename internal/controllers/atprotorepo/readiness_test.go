package atprotorepo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/repos"
)

func TestReadiness(t *testing.T) {
	// What repos.Local answers in a process without an embedded PDS (socialweb controllers).
	_, noPDS := repos.Local(context.Background(), nil, "owner.test")
	rows := []struct {
		name   string
		err    error
		reason v1alpha1.ConditionReason
		retry  time.Duration
		says   []string // the message names what to write instead
	}{
		{"refused password", fmt.Errorf("%w: xrpc 401 AuthenticationRequired", repos.ErrLoginFailed), v1alpha1.ReasonLoginFailed, unavailableRetry, nil},
		{"network", fmt.Errorf("%w: dial tcp: connection refused", repos.ErrUnavailable), v1alpha1.ReasonUnreachable, unavailableRetry, nil},
		{"unknown error", errors.New("boom"), v1alpha1.ReasonUnreachable, unavailableRetry, nil},
		// Nothing changes until the spec does (which reconciles again), so no retry.
		{"spec.local without an embedded PDS", noPDS, v1alpha1.ReasonLocalRepoUnavailable, 0,
			[]string{"spec.remote", "service", "identifier", "credentialsRef", "Secret", "password", "Run on your cluster"}},
	}
	for _, row := range rows {
		c, retry := readiness(3, nil, row.err)
		if c.Status != "False" || c.Reason != string(row.reason) || retry != row.retry || c.ObservedGeneration != 3 || c.Message != row.err.Error() {
			t.Errorf("%s: %+v retry %s, want False/%s retry %s", row.name, c, retry, row.reason, row.retry)
		}
		for _, w := range row.says {
			if !strings.Contains(c.Message, w) {
				t.Errorf("%s: message %q does not say %q", row.name, c.Message, w)
			}
		}
	}
}
