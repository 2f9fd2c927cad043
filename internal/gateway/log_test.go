package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// tailLog keeps the last max bytes of a log, starting on a character boundary, whatever the
// size of the reads.
func TestTailLog(t *testing.T) {
	lines := func(n int) string {
		var b strings.Builder
		for i := range n {
			b.WriteString(strings.Repeat("x", i%50))
			b.WriteString("\n")
		}
		return b.String()
	}
	big := lines(10000) // about 255 KB
	for _, r := range []struct {
		name, in string
		max      int
		want     string
	}{
		{"empty", "", maxLog, ""},
		{"short", "hello\nworld\n", maxLog, "hello\nworld\n"},
		{"exactly the cap", strings.Repeat("a", 64), 64, strings.Repeat("a", 64)},
		{"one over", "b" + strings.Repeat("a", 64), 64, strings.Repeat("a", 64)},
		{"over the cap: the last bytes", big, maxLog, big[len(big)-maxLog:]},
		{"a character cut by the cap is dropped", "é" + strings.Repeat("a", 63), 64, strings.Repeat("a", 63)},
		{"a character at the cap is kept", "xé" + strings.Repeat("a", 62), 64, "é" + strings.Repeat("a", 62)},
	} {
		for _, rd := range []struct {
			name string
			r    func(string) io.Reader
		}{
			{"whole", func(s string) io.Reader { return strings.NewReader(s) }},
			{"byte by byte", func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) }},
			{"half reads", func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) }},
		} {
			got, err := tailLog(rd.r(r.in), r.max)
			if err != nil || got != r.want {
				t.Errorf("%s (%s): %d bytes %q..., %v; want %d bytes", r.name, rd.name, len(got), got[:min(len(got), 20)], err, len(r.want))
			}
			if !utf8.ValidString(got) {
				t.Errorf("%s (%s): not valid UTF-8", r.name, rd.name)
			}
		}
	}
	// A read error is the caller's, not a partial log.
	boom := errors.New("boom")
	if _, err := tailLog(io.MultiReader(bytes.NewReader([]byte("abc")), iotest.ErrReader(boom)), maxLog); !errors.Is(err, boom) {
		t.Errorf("read error: %v", err)
	}
	// maxLogRead bounds the read: a log past it is cut there, and its tail still fits the cap.
	got, err := tailLog(io.LimitReader(iotest.OneByteReader(strings.NewReader(big)), 1000), 64)
	if err != nil || got != big[1000-64:1000] {
		t.Errorf("a limited read: %q %v", got, err)
	}
}

// containerLog reads the pods/log subresource of the container asked for, with tailLines.
func TestContainerLogAsksForTheTail(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"}}
	cs := fake.NewSimpleClientset(pod)
	got, err := containerLog(context.Background(), cs, pod, "main", 7)
	if err != nil || got != "fake logs" { // what the fake apiserver answers for any log
		t.Fatalf("log %q %v", got, err)
	}
	var opts *corev1.PodLogOptions
	for _, a := range cs.Actions() {
		if a.GetSubresource() == "log" && a.GetVerb() == "get" {
			if ga, ok := a.(k8stesting.GenericAction); ok {
				opts, _ = ga.GetValue().(*corev1.PodLogOptions)
			}
		}
	}
	if opts == nil || opts.Container != "main" || opts.TailLines == nil || *opts.TailLines != 7 {
		t.Errorf("log options %+v, want container main, tailLines 7", opts)
	}
}
