// Package infracollection is the reconciler of InfraCollection and EphemeralInfraCollection:
// it enumerates the deployment records of a repo into child objects that follow them.
//
// The decision that shapes it: a collection only ever creates. It reads the account's index
// at computer.socialweb.infra/self (or pages listRecords when there is no index, or the
// index is full at 256 live entries and may have left records out), plans the children with
// infra.PlanCollection, and creates one child per unbound live record with nothing but
// spec.record. The child's first sync pulls the declaration; a child whose record is gone
// deletes itself (Decide's Delete). So the collection never races its children over a
// deletion, and a record another object already binds is reported (boundBy), not adopted.
package infracollection
