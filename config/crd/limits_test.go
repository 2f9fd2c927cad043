package crd

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"socialweb.computer/lexicons"
)

// A field the API server admits but the record it is published in refuses leaves its object
// stuck after admission, so every published field is limited in the CRD at least as tightly as
// in its lexicon. Lexicon string lengths count UTF-8 bytes (and maxGraphemes graphemes); a CRD
// maxLength counts characters, so a byte limit needs a CEL rule on bytes, or a pattern (ours are
// ASCII), or a character limit a quarter of it.
func TestCRDLimitsMatchLexicons(t *testing.T) {
	const (
		infra     = "computer/socialweb/infra.json"
		ephemeral = "computer/socialweb/ephemeralInfra.json"
		vm        = "com/publicdomainrelay/temp/market/compute/vm.json"
		del       = "com/publicdomainrelay/temp/market/compute/events/vm/delete.json"
	)
	// contractFields are the fields of an Infra contract, published in the record's contracts
	// and, once requested, as a ComputeContract's spec.
	contractFields := []struct{ crd, lex string }{
		{"name", "name"},
		{"vmName", "vmName"},
		{"userData", "userData"},
		{"bidderDids", "bidderDids"},
		{"bidderDids[]", "bidderDids[]"},
		{"denyBidderDids", "denyBidderDids"},
		{"denyBidderDids[]", "denyBidderDids[]"},
		{"sshAuthorizedKeys", "sshAuthorizedKeys"},
		{"sshAuthorizedKeys[]", "sshAuthorizedKeys[]"},
		{"policy", "policy"},
		{"requireLayers", "requireLayers"},
		{"requireLayers[]", "requireLayers[]"},
		{"vmReadyTimeoutSec", "vmReadyTimeoutSec"},
		{"cpus", "cpus"},
		{"memMiB", "memMiB"},
		{"ports", "ports"},
	}
	type row struct{ crd, path, lexFile, lexDef, lexPath string }
	var rows []row
	for _, c := range []string{"infras.socialweb.computer", "ephemeralinfras.socialweb.computer"} {
		rows = append(rows,
			row{c, "spec.description", infra, "main", "description"},
			row{c, "spec.contracts", infra, "main", "contracts"},
			row{c, "spec.contracts[].ports[].name", infra, "port", "name"},
			row{c, "spec.contracts[].ports[].port", infra, "port", "port"},
		)
		for _, f := range contractFields {
			rows = append(rows, row{c, "spec.contracts[]." + f.crd, infra, "contract", f.lex})
		}
	}
	rows = append(rows, row{"ephemeralinfras.socialweb.computer", "spec.ttlSeconds", ephemeral, "main", "ttlSeconds"})
	const cc = "computecontracts.socialweb.computer"
	for _, f := range contractFields {
		if f.crd == "name" {
			continue
		}
		rows = append(rows, row{cc, "spec." + f.crd, infra, "contract", f.lex})
	}
	rows = append(rows,
		row{cc, "spec.userData", vm, "main", "user_data"},
		row{cc, "spec.cpus", vm, "main", "cpus"},
		row{cc, "spec.memMiB", vm, "main", "mem"},
		row{cc, "spec.ports", vm, "main", "ports"},
		row{cc, "spec.ports[].name", vm, "port", "name"},
		row{cc, "spec.ports[].port", vm, "port", "port"},
		row{cc, "spec.release.reason", del, "main", "reason"},
	)

	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, c := range crds {
		byName[c.Name] = c
	}
	for _, r := range rows {
		t.Run(r.crd+"/"+r.path, func(t *testing.T) {
			c := byName[r.crd]
			if c == nil {
				t.Fatalf("no CRD %s", r.crd)
			}
			prop, parent := crdProp(t, c.Spec.Versions[0].Schema.OpenAPIV3Schema, r.path)
			lex := lexProp(t, r.lexFile, r.lexDef, r.lexPath)
			for _, p := range checkLimit(prop, parent, lex) {
				t.Errorf("%s %s (lexicon %s#%s %s): %s", r.crd, r.path, r.lexFile, r.lexDef, r.lexPath, p)
			}
		})
	}
}

// crdProp walks a dotted path ("spec.contracts[].name") through a schema and returns the
// property and the array that holds it ([] last) or nil.
func crdProp(t *testing.T, s *apiextensionsv1.JSONSchemaProps, path string) (prop, parent *apiextensionsv1.JSONSchemaProps) {
	t.Helper()
	cur := s
	for _, part := range strings.Split(path, ".") {
		name, items := strings.CutSuffix(part, "[]")
		p, ok := cur.Properties[name]
		if !ok {
			t.Fatalf("schema has no %s (in %s)", name, path)
		}
		cur, parent = &p, nil
		if items {
			if cur.Items == nil || cur.Items.Schema == nil {
				t.Fatalf("%s is not an array", name)
			}
			parent, cur = cur, cur.Items.Schema
		}
	}
	return cur, parent
}

// lexLimits are the limits of one lexicon field.
type lexLimits struct {
	Type         string `json:"type"`
	MaxLength    *int64 `json:"maxLength"`
	MinLength    *int64 `json:"minLength"`
	MaxGraphemes *int64 `json:"maxGraphemes"`
	Minimum      *int64 `json:"minimum"`
	Maximum      *int64 `json:"maximum"`
	Format       string `json:"format"`
	Items        *lexLimits
	Ref          string `json:"ref"`
}

func lexProp(t *testing.T, file, def, path string) lexLimits {
	t.Helper()
	raw, err := lexicons.FS.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Defs map[string]struct {
			Record *struct {
				Properties map[string]lexLimits `json:"properties"`
			} `json:"record"`
			Properties map[string]lexLimits `json:"properties"`
		} `json:"defs"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	d, ok := doc.Defs[def]
	if !ok {
		t.Fatalf("%s has no def %s", file, def)
	}
	props := d.Properties
	if d.Record != nil {
		props = d.Record.Properties
	}
	name, items := strings.CutSuffix(path, "[]")
	p, ok := props[name]
	if !ok {
		t.Fatalf("%s#%s has no property %s", file, def, name)
	}
	if items {
		if p.Items == nil {
			t.Fatalf("%s#%s %s is not an array", file, def, name)
		}
		return *p.Items
	}
	return p
}

// checkLimit lists how the CRD property is looser than the lexicon field.
func checkLimit(prop, parent *apiextensionsv1.JSONSchemaProps, lex lexLimits) []string {
	var out []string
	switch lex.Type {
	case "string":
		if lex.Format == "did" {
			// The atproto DID syntax: ASCII, at most 2 KiB.
			if prop.Pattern == "" || prop.MaxLength == nil || *prop.MaxLength > 2048 {
				out = append(out, "a DID needs a pattern and maxLength 2048")
			}
			return out
		}
		if lex.MinLength != nil && *lex.MinLength > 0 && (prop.MinLength == nil || *prop.MinLength < *lex.MinLength) {
			out = append(out, fmt.Sprintf("minLength below the lexicon's %d", *lex.MinLength))
		}
		if lex.MaxLength == nil && lex.MaxGraphemes == nil {
			return out
		}
		if prop.MaxLength == nil {
			return append(out, "no maxLength")
		}
		m := *prop.MaxLength
		if lex.MaxGraphemes != nil && m > *lex.MaxGraphemes {
			// A grapheme is one character or more: m characters are at most m graphemes.
			out = append(out, fmt.Sprintf("maxLength %d characters may exceed %d graphemes", m, *lex.MaxGraphemes))
		}
		if lex.MaxLength != nil && 4*m > *lex.MaxLength && prop.Pattern == "" && !hasRule(prop, parent, *lex.MaxLength) {
			out = append(out, fmt.Sprintf("maxLength %d characters may exceed %d bytes and no CEL rule bounds the bytes", m, *lex.MaxLength))
		}
	case "array":
		if lex.MaxLength != nil && (prop.MaxItems == nil || *prop.MaxItems > *lex.MaxLength) {
			out = append(out, fmt.Sprintf("maxItems above the lexicon's %d", *lex.MaxLength))
		}
	case "integer":
		if lex.Minimum != nil && (prop.Minimum == nil || *prop.Minimum < float64(*lex.Minimum)) {
			out = append(out, fmt.Sprintf("minimum below the lexicon's %d", *lex.Minimum))
		}
		if lex.Maximum != nil && (prop.Maximum == nil || *prop.Maximum > float64(*lex.Maximum)) {
			out = append(out, fmt.Sprintf("maximum above the lexicon's %d", *lex.Maximum))
		}
	}
	return out
}

// hasRule reports a CEL rule bounding the UTF-8 bytes of the property to n: on the property
// itself, or on each item of the array that holds it.
func hasRule(prop, parent *apiextensionsv1.JSONSchemaProps, n int64) bool {
	for _, v := range prop.XValidations {
		if v.Rule == fmt.Sprintf("bytes(self).size() <= %d", n) {
			return true
		}
	}
	if parent != nil {
		for _, v := range parent.XValidations {
			if strings.Contains(v.Rule, "bytes(") && strings.Contains(v.Rule, fmt.Sprintf(".size() <= %d", n)) && strings.HasPrefix(v.Rule, "self.all(") {
				return true
			}
		}
	}
	return false
}

// The byte rules refuse what the character limits let through: multi-byte text of fewer
// characters than the limit but more bytes.
func TestCRDByteRules(t *testing.T) {
	big := strings.Repeat("é", 40000) // 80000 bytes, 40000 characters
	for _, c := range []string{"infras.socialweb.computer", "ephemeralinfras.socialweb.computer"} {
		wantCEL(t, celCheck(t, c, fmt.Sprintf("spec:\n  contracts: [{name: a, userData: %q}]\n", big), ""), "65536 bytes")
		wantCEL(t, celCheck(t, c, fmt.Sprintf("spec:\n  contracts: [{name: a, userData: %q}]\n", strings.Repeat("é", 32768)), ""), "")
		wantCEL(t, celCheck(t, c, fmt.Sprintf("spec:\n  contracts: [{name: a, vmName: %q}]\n", strings.Repeat("é", 200)), ""), "253 bytes")
		wantCEL(t, celCheck(t, c, fmt.Sprintf("spec:\n  contracts: [{name: a, sshAuthorizedKeys: [%q]}]\n", strings.Repeat("é", 5000)), ""), "8192 bytes")
	}
	const cc = "computecontracts.socialweb.computer"
	wantCEL(t, celCheck(t, cc, fmt.Sprintf("spec: {userData: %q}\n", big), ""), "65536 bytes")
	wantCEL(t, celCheck(t, cc, fmt.Sprintf("spec: {policy: %q}\n", strings.Repeat("é", 200)), ""), "256 bytes")
	wantCEL(t, celCheck(t, cc, "spec: {userData: hello, policy: com.publicdomainrelay.temp.market.policies.open}\n", ""), "")
}
