package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// PprofOff is the --pprof-addr that serves no profiles (the default).
const PprofOff = "0"

// NotLoopbackPprofError refuses a profiling address off this machine: a heap profile holds
// whatever the process holds (tokens, keys, request bodies).
type NotLoopbackPprofError struct{ Addr string }

func (e *NotLoopbackPprofError) Error() string {
	return fmt.Sprintf("pprof address %s: want a loopback address such as 127.0.0.1:6060", e.Addr)
}

// startPprof serves Go's runtime profiles (net/http/pprof) on addr, a loopback address, until
// ctx ends, and returns the address it listens on. The handlers are on a mux of their own,
// never on a server that takes requests from elsewhere.
func startPprof(ctx context.Context, addr string, log *slog.Logger) (string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("pprof address %s: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return "", &NotLoopbackPprofError{Addr: addr}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("pprof: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof server stopped", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return ln.Addr().String(), nil
}
