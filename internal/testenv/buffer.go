package testenv

import "socialweb.computer/internal/logsink"

// LogBuffer is a log sink a test reads while other goroutines (controllers, a child's output
// copier) write to it.
type LogBuffer = logsink.Buffer
