package v1alpha1

// Deepcopy methods (zz_generated.deepcopy.go) and the CRDs
// (config/crd/bases/socialweb.computer_*.yaml) are generated from the markers
// in this package. hack/verify-generated.sh checks they are up to date.

//go:generate go tool controller-gen object paths=.
//go:generate go tool controller-gen crd paths=. output:crd:artifacts:config=../../config/crd/bases
