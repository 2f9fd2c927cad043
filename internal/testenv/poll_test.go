package testenv

import (
	"testing"
	"time"
)

func TestPollWait(t *testing.T) {
	for _, tc := range []struct{ spent, want time.Duration }{
		{0, 10 * time.Millisecond},                       // an API read: fine-grained
		{2 * time.Millisecond, 10 * time.Millisecond},    //
		{150 * time.Millisecond, 300 * time.Millisecond}, // a kubectl process: a third of the time
		{5 * time.Second, time.Second},                   // a probe that timed out: at most a second
	} {
		if got := pollWait(tc.spent); got != tc.want {
			t.Errorf("pollWait(%s) = %s, want %s", tc.spent, got, tc.want)
		}
	}
}
