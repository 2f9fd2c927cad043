package pds

import (
	"net/http"

	"socialweb.computer/internal/xrpc"
)

// XRPCError is an error with the XRPC error name and HTTP status the reference PDS answers.
type XRPCError = xrpc.Error

func errInvalidRequest(format string, args ...any) *XRPCError {
	return xrpc.Errorf(http.StatusBadRequest, xrpc.InvalidRequest, format, args...)
}

func errNamed(status int, name, format string, args ...any) *XRPCError {
	return xrpc.Errorf(status, name, format, args...)
}
