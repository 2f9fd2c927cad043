// Package app composes the pieces of socialweb into the processes the CLI runs: the
// embedded stack of `socialweb up` and the controllers-only process of `socialweb
// controllers`. It owns start-up order, shutdown order and progress output; the pieces
// themselves know nothing of each other.
package app
