package core

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The line etcd's giving up becomes: the store's directory, etcd's message, its error and
// the room left, on one line.
func TestStoreStoppedLine(t *testing.T) {
	dir := t.TempDir()
	h := storeStopped{dir: dir}
	got := h.line("failed to commit tx", []zapcore.Field{zap.String("x", "y"), zap.Error(errors.New("write db:\nno space left on device"))})
	for _, want := range []string{"the store in " + dir + " stopped: failed to commit tx: write db: no space left on device", "free on its file system)"} {
		if !strings.Contains(got, want) {
			t.Errorf("line %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "\n") {
		t.Errorf("line %q has a newline", got)
	}
}
