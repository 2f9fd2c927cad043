// Package console is the live web console of `socialweb up`: one page on 127.0.0.1 that
// shows the deployments (Infra, EphemeralInfra) with their contracts and phases, each
// contract's market history (RFP, bids, accept, receipt, events) with the records' at-URIs
// and a timeline from Requested on, and the tenant clusters with their NodeClaims.
//
// The data comes from informers on up's own API server (the ComputeContract status is the
// market as the requester read it from the records). The page is rendered on the server with
// html/template; a small script swaps in each new rendering the server pushes over
// server-sent events, so the page updates without a reload and the browser never polls.
//
// The view model (view.go) is pure: objects in, rows out. The HTTP side (server.go) holds
// the authentication (the admin bearer token, or a session cookie the token buys once), the
// Content-Security-Policy and the event stream. Every value shown comes from records and
// objects other people can write, so everything goes through html/template escaping and no
// inline script is allowed to run (docs/console.md, docs/security.md).
package console
