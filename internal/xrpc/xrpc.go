package xrpc

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Error names more than one service answers with (a service adds its own).
const (
	InvalidRequest       = "InvalidRequest"
	AuthMissing          = "AuthMissing"
	InvalidToken         = "InvalidToken"
	ExpiredToken         = "ExpiredToken"
	MethodNotImplemented = "MethodNotImplemented"
	// PayloadTooLarge is the reference xrpc-server's name for a 413.
	PayloadTooLarge     = "PayloadTooLarge"
	RateLimitExceeded   = "RateLimitExceeded"
	InternalServerError = "InternalServerError"
	RecordNotFound      = "RecordNotFound"
	InvalidSwap         = "InvalidSwap"
)

// Error is an XRPC error answer: written as {"error": Name, "message": Message} with Status.
type Error struct {
	Status  int
	Name    string
	Message string
	// RetryAfter, when set, is when the caller may call again (the Retry-After header, in
	// whole seconds, at least 1).
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Name + ": " + e.Message }

// Errorf is the error named name, answered with status.
func Errorf(status int, name, format string, args ...any) *Error {
	return &Error{Status: status, Name: name, Message: fmt.Sprintf(format, args...)}
}

// body is the wire form of an Error.
type body struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// WriteJSON writes v as the JSON answer with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError writes err as an XRPC error answer. An err that is not (or does not wrap) an
// *Error is answered as InternalServerError without its text.
func WriteError(w http.ResponseWriter, err error) {
	var xe *Error
	if !errors.As(err, &xe) {
		xe = &Error{Status: http.StatusInternalServerError, Name: InternalServerError, Message: "Internal Server Error"}
	}
	if xe.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(xe.RetryAfter.Seconds())))))
	}
	WriteJSON(w, xe.Status, body{Error: xe.Name, Message: xe.Message})
}

// Decode reads an answer of status with header h and body raw as an XRPC error; ok is false
// when raw is not one (no "error" name), so the caller can report the raw answer instead.
func Decode(status int, h http.Header, raw []byte) (e *Error, ok bool) {
	var b body
	if json.Unmarshal(raw, &b) != nil || b.Error == "" {
		return nil, false
	}
	e = &Error{Status: status, Name: b.Error, Message: b.Message}
	if secs, err := strconv.Atoi(h.Get("Retry-After")); err == nil && secs > 0 {
		e.RetryAfter = time.Duration(secs) * time.Second
	}
	return e, true
}

// Why BearerToken found no token.
var (
	// ErrNoAuthorization: the call has no Authorization header.
	ErrNoAuthorization = errors.New("no Authorization header")
	// ErrNotBearer: the Authorization header is not "Bearer <token>".
	ErrNotBearer = errors.New("the Authorization header is not a Bearer token")
)

// BearerToken is the token of a call's Authorization header authz ("Bearer <token>"), without
// surrounding space. The scheme is matched without regard to case (RFC 7235). Each service
// answers ErrNoAuthorization and ErrNotBearer with its own names.
func BearerToken(authz string) (string, error) {
	if authz == "" {
		return "", ErrNoAuthorization
	}
	scheme, tok, ok := strings.Cut(authz, " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", ErrNotBearer
	}
	return tok, nil
}
