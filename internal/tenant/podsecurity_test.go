package tenant

import (
	"testing"

	"sigs.k8s.io/yaml"
)

func TestParsePodSecurityLevel(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    PodSecurityLevel
		wantErr bool
	}{
		{"", PodSecurityBaseline, false},
		{"baseline", PodSecurityBaseline, false},
		{"restricted", PodSecurityRestricted, false},
		{"privileged", "", true},
		{"Restricted", "", true},
	} {
		got, err := ParsePodSecurityLevel(tc.in)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("ParsePodSecurityLevel(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// An owner may tighten the operator's floor, never loosen it.
func TestStricter(t *testing.T) {
	for _, tc := range []struct {
		floor, owner, want PodSecurityLevel
	}{
		{PodSecurityBaseline, "", PodSecurityBaseline},
		{PodSecurityBaseline, PodSecurityRestricted, PodSecurityRestricted},
		{PodSecurityRestricted, PodSecurityBaseline, PodSecurityRestricted},
		{PodSecurityRestricted, "", PodSecurityRestricted},
		{"", "", PodSecurityBaseline},
		{PodSecurityBaseline, "privileged", PodSecurityBaseline},
	} {
		if got := Stricter(tc.floor, tc.owner); got != tc.want {
			t.Errorf("Stricter(%q, %q) = %q, want %q", tc.floor, tc.owner, got, tc.want)
		}
	}
}

// The admission configuration enforces the level by default, warns and audits restricted,
// exempts nothing, and gives the floor plugin the same level.
func TestAdmissionConfig(t *testing.T) {
	for _, level := range []PodSecurityLevel{PodSecurityBaseline, PodSecurityRestricted} {
		var c struct {
			APIVersion string `json:"apiVersion"`
			Kind       string
			Plugins    []struct {
				Name          string
				Configuration map[string]any
			}
		}
		if err := yaml.UnmarshalStrict(AdmissionConfig(level), &c); err != nil {
			t.Fatal(err)
		}
		if c.Kind != "AdmissionConfiguration" || len(c.Plugins) != 2 {
			t.Fatalf("%s: %+v", level, c)
		}
		ps, fl := c.Plugins[0], c.Plugins[1]
		d, _ := ps.Configuration["defaults"].(map[string]any)
		if ps.Name != "PodSecurity" || d["enforce"] != string(level) || d["warn"] != "restricted" || d["audit"] != "restricted" {
			t.Errorf("%s: PodSecurity %+v", level, ps)
		}
		ex, _ := ps.Configuration["exemptions"].(map[string]any)
		for _, k := range []string{"usernames", "namespaces", "runtimeClasses"} {
			if l, ok := ex[k].([]any); !ok || len(l) != 0 {
				t.Errorf("%s: exemptions %s = %v, want none", level, k, ex[k])
			}
		}
		if fl.Name != FloorPluginName || fl.Configuration["level"] != string(level) {
			t.Errorf("%s: floor %+v", level, fl)
		}
	}
}
