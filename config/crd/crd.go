// Package crd embeds the CustomResourceDefinitions of the socialweb.computer
// API, generated into bases/ by go generate ./api/... (controller-gen).
package crd

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

//go:embed bases/*.yaml
var bases embed.FS

// CRDs decodes the embedded CustomResourceDefinitions, sorted by name.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := fs.Glob(bases, "bases/*.yaml")
	if err != nil {
		return nil, err
	}
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(files))
	for _, f := range files {
		data, err := bases.ReadFile(f)
		if err != nil {
			return nil, err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return nil, fmt.Errorf("decode %s: %w", f, err)
		}
		if crd.Kind != "CustomResourceDefinition" || crd.Name == "" {
			return nil, fmt.Errorf("decode %s: not a named CustomResourceDefinition", f)
		}
		out = append(out, crd)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
