package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"socialweb.computer/internal/quota"
)

// XRPC error names the gateway answers with.
const (
	ErrAuthMissing     = "AuthMissing"
	ErrInvalidToken    = "InvalidToken"
	ErrBadExpiration   = "BadExpiration"
	ErrClusterNotFound = "ClusterNotFound"
	ErrClusterNotReady = "ClusterNotReady"
	ErrInvalidRequest  = "InvalidRequest"
	ErrMethodNotFound  = "MethodNotImplemented"
	ErrInternal        = "InternalServerError"
	// ErrAccountNotAllowed: the caller's DID is not one the operator admits.
	ErrAccountNotAllowed = "AccountNotAllowed"
	// ErrQuotaExceeded: a creation past one of the account's quotas.
	ErrQuotaExceeded = "QuotaExceeded"
	// ErrRateLimitExceeded: too many calls from the caller's address or account.
	ErrRateLimitExceeded = "RateLimitExceeded"
)

// Error is an XRPC error: written as {"error": Name, "message": Message} with Status.
type Error struct {
	Status  int
	Name    string
	Message string
	// RetryAfter, for RateLimitExceeded, is when the caller may call again (the
	// Retry-After header, in whole seconds).
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Name + ": " + e.Message }

func xrpcErr(status int, name, format string, args ...any) *Error {
	return &Error{Status: status, Name: name, Message: fmt.Sprintf(format, args...)}
}

func invalidRequest(format string, args ...any) *Error {
	return xrpcErr(http.StatusBadRequest, ErrInvalidRequest, format, args...)
}

func notFound(name string) *Error {
	return xrpcErr(http.StatusBadRequest, ErrClusterNotFound, "no cluster named %q in this account", name)
}

func notReady(format string, args ...any) *Error {
	return xrpcErr(http.StatusBadRequest, ErrClusterNotReady, format, args...)
}

// quotaExceeded is the refusal of a creation past a quota: the quota, its limit and the
// account's use, and what the caller can do.
func quotaExceeded(e *quota.Exceeded, remedy string) *Error {
	return xrpcErr(http.StatusForbidden, ErrQuotaExceeded, "%s; %s", e.Error(), remedy)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes err as an XRPC error; anything but an *Error is an internal error whose
// detail stays in the log.
func writeError(w http.ResponseWriter, err error) {
	var xe *Error
	if !errors.As(err, &xe) {
		xe = &Error{Status: http.StatusInternalServerError, Name: ErrInternal, Message: "Internal Server Error"}
	}
	if xe.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="socialweb-gateway"`)
	}
	if xe.RetryAfter > 0 {
		w.Header().Set("Retry-After", retryAfterHeader(xe.RetryAfter))
	}
	writeJSON(w, xe.Status, map[string]string{"error": xe.Name, "message": xe.Message})
}
