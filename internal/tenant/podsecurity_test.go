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
		if err := yaml.UnmarshalStrict(AdmissionConfig(PodPolicy{Level: level}), &c); err != nil {
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
		if fl.Name != FloorPluginName || fl.Configuration["level"] != string(level) || fl.Configuration["userNamespaces"] != "optional" {
			t.Errorf("%s: floor %+v", level, fl)
		}
	}
}

// An owner tightens the operator's floor in each part and never loosens it.
func TestTighten(t *testing.T) {
	req, opt := PodUserNamespacesRequired, PodUserNamespacesOptional
	for _, tc := range []struct {
		floor, owner, want PodPolicy
	}{
		{PodPolicy{}, PodPolicy{}, PodPolicy{PodSecurityBaseline, opt}},
		{PodPolicy{UserNamespaces: req}, PodPolicy{UserNamespaces: opt}, PodPolicy{PodSecurityBaseline, req}},
		{PodPolicy{UserNamespaces: opt}, PodPolicy{UserNamespaces: req}, PodPolicy{PodSecurityBaseline, req}},
		{PodPolicy{PodSecurityRestricted, opt}, PodPolicy{PodSecurityBaseline, req}, PodPolicy{PodSecurityRestricted, req}},
		{PodPolicy{PodSecurityBaseline, ""}, PodPolicy{PodSecurityRestricted, ""}, PodPolicy{PodSecurityRestricted, opt}},
	} {
		if got := Tighten(tc.floor, tc.owner); got != tc.want {
			t.Errorf("Tighten(%+v, %+v) = %+v, want %+v", tc.floor, tc.owner, got, tc.want)
		}
	}
	if _, err := ParsePodUserNamespaces("sometimes"); err == nil {
		t.Error("ParsePodUserNamespaces accepted sometimes")
	}
	var c struct {
		Plugins []struct{ Configuration map[string]any }
	}
	if err := yaml.Unmarshal(AdmissionConfig(PodPolicy{UserNamespaces: req}), &c); err != nil || c.Plugins[1].Configuration["userNamespaces"] != "required" {
		t.Errorf("AdmissionConfig with required user namespaces: %+v, %v", c, err)
	}
}

func TestChoosePodUserNamespaces(t *testing.T) {
	for _, tc := range []struct {
		flag    string
		run     bool
		want    PodUserNamespaces
		wantErr bool
	}{
		{"auto", true, PodUserNamespacesRequired, false},
		{"auto", false, PodUserNamespacesOptional, false},
		{"", true, PodUserNamespacesRequired, false},
		{"required", false, PodUserNamespacesRequired, false},
		{"optional", true, PodUserNamespacesOptional, false},
		{"always", true, "", true},
	} {
		got, why, err := ChoosePodUserNamespaces(tc.flag, tc.run, "vm nodes")
		if got != tc.want || (err != nil) != tc.wantErr || err == nil && why == "" {
			t.Errorf("ChoosePodUserNamespaces(%q, %v) = %q, %q, %v; want %q", tc.flag, tc.run, got, why, err, tc.want)
		}
	}
}
