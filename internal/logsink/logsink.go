// Package logsink routes the logs of the Kubernetes libraries (klog) away from the
// terminal: the API server and client-go log at info level by default, which buries the
// phases and errors a user of the CLI needs to see.
package logsink

import (
	"flag"
	"io"
	"sync"

	"k8s.io/klog/v2"
)

var once sync.Once

// KlogTo sends every klog line to w and nothing to stderr.
func KlogTo(w io.Writer) {
	once.Do(func() {
		fs := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(fs)
		_ = fs.Set("logtostderr", "false")
		_ = fs.Set("alsologtostderr", "false")
		_ = fs.Set("stderrthreshold", "FATAL")
	})
	klog.SetOutput(w)
}
