// Command stampcheck prints the Kubernetes versions a binary built without -ldflags reports
// once it imports kubeversion (kubeversion_test builds and runs it).
package main

import (
	"fmt"

	clientversion "k8s.io/client-go/pkg/version"
	"k8s.io/component-base/version"

	_ "socialweb.computer/internal/kubeversion"
)

func main() {
	b, c := version.Get(), clientversion.Get()
	fmt.Println(b.GitVersion, b.Major, b.Minor, c.GitVersion, c.Major, c.Minor)
}
