// Package pds is an atproto Personal Data Server assembled from indigo's atproto packages:
// accounts with did:plc identities, signed repositories (MST, DAG-CBOR, CIDv1, TID revs), the
// com.atproto.repo/sync/server/identity XRPC endpoints, and a persisted firehose.
//
// The decision that shapes it: every write to a repo goes through one path, (*Server).applyWrites,
// which builds the new MST and commit in memory and then stores blocks, record index, repo head
// and the firehose event in a single bbolt transaction. A write that is refused, or whose
// transaction fails, leaves nothing behind: the in-memory tree is only replaced after the
// transaction commits. The blob references a record makes are checked and counted in that same
// transaction; blob bytes live behind a BlobStore, outside it. The reference TypeScript PDS's observed behaviour (error names, status
// codes, swap and no-op rules) is the contract the handlers follow; docs/pds.md lists where and
// why this server differs.
package pds
