// Package xrpc is the server side of XRPC that the PDS, the gateway and the bidder's
// deliverSecrets endpoint share: named errors, JSON answers and the bearer token of a call.
//
// An XRPC error is an HTTP status and a body {"error": Name, "message": Message}; clients
// branch on Name, so a handler returns an *Error with the name the method's lexicon (or the
// reference PDS) gives, and WriteError puts it on the wire. Any other error is answered as
// InternalServerError with a fixed message: its detail belongs in the server's log, not in an
// answer to a caller. Decode is the inverse, for clients, so that both sides agree on one
// shape.
package xrpc
