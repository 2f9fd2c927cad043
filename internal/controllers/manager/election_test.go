package manager

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func TestLeaseIdentity(t *testing.T) {
	host := func() (string, error) { return "node-a", nil }
	for _, tc := range []struct {
		name       string
		env        map[string]string
		hostname   func() (string, error)
		wantPrefix string
		wantPerPod bool
		wantErr    bool
	}{
		{name: "a pod: its name and UID, the same each run", env: map[string]string{PodNameEnv: "ctl-7d9-x2", PodUIDEnv: "0b1c"},
			hostname: host, wantPrefix: "ctl-7d9-x2_0b1c", wantPerPod: true},
		{name: "no UID: a new identity each run", env: map[string]string{PodNameEnv: "ctl-7d9-x2"}, hostname: host, wantPrefix: "node-a_"},
		{name: "no name: a new identity each run", env: map[string]string{PodUIDEnv: "0b1c"}, hostname: host, wantPrefix: "node-a_"},
		{name: "outside a pod", hostname: host, wantPrefix: "node-a_"},
		{name: "no hostname", hostname: func() (string, error) { return "", errors.New("uts") }, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, perPod, err := leaseIdentity(func(k string) string { return tc.env[k] }, tc.hostname)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if !strings.HasPrefix(id, tc.wantPrefix) || perPod != tc.wantPerPod {
				t.Errorf("identity %q perPod %v, want prefix %q perPod %v", id, perPod, tc.wantPrefix, tc.wantPerPod)
			}
			if !perPod {
				again, _, _ := leaseIdentity(func(k string) string { return tc.env[k] }, tc.hostname)
				if again == id {
					t.Errorf("identity %q repeats across runs outside a pod", id)
				}
			}
		})
	}
}

func TestStaleOwnLease(t *testing.T) {
	const me = "ctl-7d9-x2_0b1c"
	for _, tc := range []struct {
		name string
		rec  *resourcelock.LeaderElectionRecord
		want bool
	}{
		{"an earlier run of this container held it", &resourcelock.LeaderElectionRecord{HolderIdentity: me}, true},
		{"another replica holds it", &resourcelock.LeaderElectionRecord{HolderIdentity: "ctl-7d9-q8_77aa"}, false},
		{"released", &resourcelock.LeaderElectionRecord{}, false},
		{"no Lease yet", nil, false},
	} {
		if got := staleOwnLease(tc.rec, me); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if staleOwnLease(&resourcelock.LeaderElectionRecord{}, "") {
		t.Error("an empty identity matched a released Lease")
	}
}
