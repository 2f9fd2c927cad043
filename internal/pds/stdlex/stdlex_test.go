package stdlex

import (
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/lexicon"
)

// TestSetMatchesSource checks that the embedded catalog loads, that it holds exactly the
// record types SOURCE lists from the reference PDS with the same key types, and that every
// ref the embedded lexicons name resolves.
func TestSetMatchesSource(t *testing.T) {
	cat, err := Catalog()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, l := range strings.Split(Source, "\n") {
		if rest, ok := strings.CutPrefix(l, "record "); ok {
			nsid, key, _ := strings.Cut(rest, " ")
			want[nsid] = key
		}
	}
	if len(want) == 0 {
		t.Fatal("SOURCE lists no record types")
	}
	got := Collections()
	if len(got) != len(want) {
		t.Errorf("%d record types embedded, SOURCE lists %d", len(got), len(want))
	}
	for nsid, key := range want {
		if k, ok := RecordKey(nsid); !ok || k != key {
			t.Errorf("%s: key %q (known %v), reference %q", nsid, k, ok, key)
		}
		if _, err := cat.Resolve(nsid); err != nil {
			t.Errorf("%s: %v", nsid, err)
		}
	}
	for _, c := range []string{"app.bsky.feed.post", "app.bsky.actor.profile", "chat.bsky.actor.declaration"} {
		if _, ok := RecordKey(c); !ok {
			t.Errorf("%s is not embedded", c)
		}
	}
	// A post with every optional part checks the refs it reaches (facets, embeds, labels).
	post := map[string]any{
		"$type": "app.bsky.feed.post", "text": "hi", "createdAt": "2026-12-03T12:00:00Z",
		"facets": []any{map[string]any{"index": map[string]any{"byteStart": int64(0), "byteEnd": int64(2)},
			"features": []any{map[string]any{"$type": "app.bsky.richtext.facet#tag", "tag": "hi"}}}},
		"embed":  map[string]any{"$type": "app.bsky.embed.external", "external": map[string]any{"uri": "https://example.com", "title": "t", "description": "d"}},
		"labels": map[string]any{"$type": "com.atproto.label.defs#selfLabels", "values": []any{map[string]any{"val": "nudity"}}},
	}
	if err := lexicon.ValidateRecord(cat, post, "app.bsky.feed.post", 0); err != nil {
		t.Fatalf("full post: %v", err)
	}
}

// BenchmarkValidatePost is the cost the standard set adds to a write of a typical post.
func BenchmarkValidatePost(b *testing.B) {
	cat, err := Catalog()
	if err != nil {
		b.Fatal(err)
	}
	post := map[string]any{"$type": "app.bsky.feed.post", "text": strings.Repeat("hello world ", 20), "createdAt": "2026-12-03T12:00:00Z",
		"langs": []any{"en"}, "embed": map[string]any{"$type": "app.bsky.embed.external",
			"external": map[string]any{"uri": "https://example.com", "title": "t", "description": "d"}}}
	for b.Loop() {
		if err := lexicon.ValidateRecord(cat, post, "app.bsky.feed.post", 0); err != nil {
			b.Fatal(err)
		}
	}
}
