// Package core runs the embedded control plane of socialweb: an etcd member and a
// k8s.io/apiextensions-apiserver that serves the socialweb.computer kinds, in this process,
// on 127.0.0.1, over TLS, for one admin identity.
//
// The shaping decision: the server is the real Kubernetes API machinery (storage, watch,
// validation, server-side apply, OpenAPI), not a look-alike, so that the controllers that
// run against it run unchanged against any Kubernetes or kcp API server. What the embedded
// server lacks compared with kube-apiserver is filled in here and nowhere else: aggregated
// discovery at /apis (apiextensions leaves it to the aggregator), a static bearer-token
// authenticator with a group authorizer, and core/v1 Secrets (kube-apiserver's own storage,
// encrypted at rest), the one core kind the controllers use.
//
// Everything the core owns lives in one data directory (see DataDir) guarded by a lock, so
// a second process can neither share nor corrupt it.
package core
