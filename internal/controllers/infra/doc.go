// Package infra is the reconciler of Infra and EphemeralInfra: deployments that own their
// ComputeContracts and mirror themselves to a computer.socialweb.infra record.
//
// A reconcile reads the object, calls the pure decisions of internal/infra, applies what
// they return, and writes status once. Each sub-step lives in its own file.
package infra
