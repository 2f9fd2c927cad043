package pds

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// XRPCError is an error with the XRPC error name and HTTP status the reference PDS answers.
type XRPCError struct {
	Status  int
	Name    string
	Message string
}

func (e *XRPCError) Error() string { return fmt.Sprintf("%s: %s", e.Name, e.Message) }

func errInvalidRequest(format string, args ...any) *XRPCError {
	return &XRPCError{Status: 400, Name: "InvalidRequest", Message: fmt.Sprintf(format, args...)}
}

func errNamed(status int, name, format string, args ...any) *XRPCError {
	return &XRPCError{Status: status, Name: name, Message: fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeXRPCError(w http.ResponseWriter, err error) {
	xe, ok := err.(*XRPCError)
	if !ok {
		xe = &XRPCError{Status: 500, Name: "InternalServerError", Message: "Internal Server Error"}
	}
	writeJSON(w, xe.Status, map[string]string{"error": xe.Name, "message": xe.Message})
}
