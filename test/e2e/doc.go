// Package e2e holds the end-to-end rows: real etcd, real API server, real controllers,
// the real binary and kubectl, asserting what a user would observe.
package e2e
