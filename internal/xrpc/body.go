package xrpc

import (
	"errors"
	"net/http"
)

// LimitBody refuses, with 413 PayloadTooLarge, a request whose declared Content-Length is over
// max, before its body is read: Go's server sends "100 Continue" only once a handler reads, so
// a client that sent "Expect: 100-continue" gets this answer instead of a go-ahead and a reset
// midway through its upload. A body within it, or of unknown length (chunked), is capped at
// max as it is read; BodyTooLarge turns the read error past the cap into the same answer (the
// connection is closed after it).
func LimitBody(w http.ResponseWriter, r *http.Request, max int64) *Error {
	if r.ContentLength > max {
		return Errorf(http.StatusRequestEntityTooLarge, PayloadTooLarge, "request body is %d bytes, more than %d", r.ContentLength, max)
	}
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, max)
	}
	return nil
}

// BodyTooLarge is the 413 PayloadTooLarge of a read of a LimitBody body past its cap, or nil
// for any other error.
func BodyTooLarge(err error) *Error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return Errorf(http.StatusRequestEntityTooLarge, PayloadTooLarge, "request body is more than %d bytes", mbe.Limit)
	}
	return nil
}
