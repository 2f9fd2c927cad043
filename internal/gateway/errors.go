package gateway

import (
	"errors"
	"net/http"

	"socialweb.computer/internal/quota"
	"socialweb.computer/internal/xrpc"
)

// XRPC error names the gateway answers with.
const (
	ErrAuthMissing     = xrpc.AuthMissing
	ErrInvalidToken    = xrpc.InvalidToken
	ErrBadExpiration   = "BadExpiration"
	ErrClusterNotFound = "ClusterNotFound"
	ErrClusterNotReady = "ClusterNotReady"
	ErrInvalidRequest  = xrpc.InvalidRequest
	ErrMethodNotFound  = xrpc.MethodNotImplemented
	ErrInternal        = xrpc.InternalServerError
	// ErrPayloadTooLarge: a procedure's input over the gateway's limit (413).
	ErrPayloadTooLarge = xrpc.PayloadTooLarge
	// ErrAccountNotAllowed: the caller's DID is not one the operator admits.
	ErrAccountNotAllowed = "AccountNotAllowed"
	// ErrQuotaExceeded: a creation past one of the account's quotas.
	ErrQuotaExceeded = "QuotaExceeded"
	// ErrRateLimitExceeded: too many calls from the caller's address or account.
	ErrRateLimitExceeded = xrpc.RateLimitExceeded
)

// Error is an XRPC error: written as {"error": Name, "message": Message} with Status, and
// for RateLimitExceeded a Retry-After.
type Error = xrpc.Error

func xrpcErr(status int, name, format string, args ...any) *Error {
	return xrpc.Errorf(status, name, format, args...)
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

// writeError writes err as an XRPC error; anything but an *Error is an internal error whose
// detail stays in the log. A 401 names the scheme to authenticate with.
func writeError(w http.ResponseWriter, err error) {
	if xe := (*Error)(nil); errors.As(err, &xe) && xe.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="socialweb-gateway"`)
	}
	xrpc.WriteError(w, err)
}
