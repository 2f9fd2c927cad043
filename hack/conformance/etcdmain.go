//go:build ignore

// etcdmain.go is the etcd server of the Aggregator spec's image (/usr/local/bin/etcd): the
// etcd the project embeds, built by the harness with its own copy of go.mod (the build tag
// keeps it out of the project's packages).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
