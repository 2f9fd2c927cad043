package repos

import (
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"socialweb.computer/internal/firehose"
)

func TestFromFirehoseChecksWhatAPDSSends(t *testing.T) {
	commit := func(repo string, paths ...string) *firehose.Event {
		c := &comatproto.SyncSubscribeRepos_Commit{Repo: repo, Time: "2026-01-02T03:04:05Z"}
		for _, p := range paths {
			c.Ops = append(c.Ops, &comatproto.SyncSubscribeRepos_RepoOp{Action: "delete", Path: p})
		}
		return &firehose.Event{Seq: 7, Commit: c}
	}
	for _, tc := range []struct {
		name string
		ev   *firehose.Event
		want Event
	}{
		{"record ops", commit("did:plc:abc", "computer.socialweb.infra/web", "app.bsky.feed.post/3k"),
			Event{Seq: 7, DID: "did:plc:abc", Ops: []Op{{Action: "delete", Collection: "computer.socialweb.infra", RKey: "web"}, {Action: "delete", Collection: "app.bsky.feed.post", RKey: "3k"}}}},
		{"repo not a DID", commit("alice.example.com", "computer.socialweb.infra/web"), Event{Seq: 7}},
		{"empty repo", commit("", "computer.socialweb.infra/web"), Event{Seq: 7}},
		{"hostile paths dropped", commit("did:plc:abc",
			"computer.socialweb.infra/web/extra", "computer.socialweb.infra", "infra/web", "/web",
			"computer.socialweb.infra/..", "computer.socialweb.infra/", "computer.socialweb.infra/a b",
			"computer.socialweb.infra/wéb", "computer.socialweb.infra/a%2Fb", "computer.socialweb.infra/ok"),
			Event{Seq: 7, DID: "did:plc:abc", Ops: []Op{{Action: "delete", Collection: "computer.socialweb.infra", RKey: "ok"}}}},
		{"identity", &firehose.Event{Seq: 8, Identity: &comatproto.SyncSubscribeRepos_Identity{Did: "did:plc:abc"}}, Event{Seq: 8, DID: "did:plc:abc"}},
		{"info", &firehose.Event{Seq: 9}, Event{Seq: 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, fromFirehose(tc.ev), cmpopts.IgnoreFields(Event{}, "Time")); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}
