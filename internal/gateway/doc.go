// Package gateway is the XRPC server in front of tenant clusters: the
// com.publicdomainrelay.temp.cluster.* methods, for any atproto account, over HTTP on
// 127.0.0.1.
//
// The one decision that shapes it: the caller is whoever signed the service-auth token. Every
// call carries a bearer JWT minted by the caller's PDS (com.atproto.server.getServiceAuth),
// checked by internal/serviceauth against the issuer's DID document (signature, audience one
// of the gateway's, lxm equal to the called NSID, exp, iat, one use per jti). The account is
// the token's iss and never an input field, and each account's Cluster objects live in a
// namespace derived from its DID (AccountNamespace), so a name can only ever reach the
// caller's own clusters: another account's cluster answers ClusterNotFound, the same as one
// that does not exist.
//
// The gateway writes desired state (Cluster objects in the core) and reads status; the
// Cluster controller runs the control planes. It mints kubeconfigs from the cluster CA on
// disk (internal/tenant), so it runs next to the tenant data directory.
package gateway
