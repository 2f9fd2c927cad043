package lexgen

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExported(t *testing.T) {
	for in, want := range map[string]string{
		"endpointUrl":              "EndpointURL",
		"user_data":                "UserData",
		"vmName":                   "VMName",
		"ttlSeconds":               "TTLSeconds",
		"requesterDid":             "RequesterDID",
		"onNetwork":                "OnNetwork",
		"cid":                      "CID",
		"apiVersion":               "APIVersion",
		"SnapshotComplete":         "SnapshotComplete",
		"computer.socialweb.infra": "ComputerSocialwebInfra",
		"3d":                       "X3d",
	} {
		if got := exported(in); got != want {
			t.Errorf("exported(%q) = %q, want %q", in, got, want)
		}
	}
	if got := baseName("com.publicdomainrelay.temp.market.compute.events.vm.onNetwork", "com.publicdomainrelay.temp.market"); got != "ComputeEventsVMOnNetwork" {
		t.Errorf("baseName = %s", got)
	}
}

func readProject(t *testing.T) []File {
	t.Helper()
	files, err := ReadDir("../../lexicons")
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestUpToDate is the Go form of hack/verify-lexgen.sh: the committed files
// are what the generator writes, and a second run writes the same bytes.
func TestUpToDate(t *testing.T) {
	a, err := Generate(readProject(t), Project)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Generate(readProject(t), Project)
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range a {
		if !bytes.Equal(src, b[name]) {
			t.Errorf("%s differs between two runs", name)
		}
		have, err := os.ReadFile(filepath.Join("../atproto", name))
		if err != nil {
			t.Errorf("%s: %v (run go generate ./lexicons)", name, err)
			continue
		}
		if !bytes.Equal(have, src) {
			t.Errorf("internal/atproto/%s is stale: run go generate ./lexicons", name)
		}
	}
	for _, pkg := range []string{"infra", "market", "cluster", "atrepo"} {
		if _, ok := a[pkg+"/zz_generated.lexicons.go"]; !ok {
			t.Errorf("no package %s", pkg)
		}
	}
}

func gen1(t *testing.T, lex string) error {
	t.Helper()
	_, err := Generate([]File{{Name: "x.json", Data: []byte(lex)}}, Config{
		Packages:       []Package{{Prefix: "com.example", Name: "ex"}},
		ImportBase:     "example.com/gen",
		LexiconsImport: "example.com/lexicons",
	})
	return err
}

func TestRefusals(t *testing.T) {
	cases := map[string]string{
		"no package": `{"lexicon":1,"id":"org.other.thing","defs":{"main":{"type":"object","properties":{}}}}`,
		"inline object": `{"lexicon":1,"id":"com.example.thing","defs":{"main":{"type":"object","properties":{
			"inner":{"type":"object","properties":{}}}}}}`,
		"nullable":     `{"lexicon":1,"id":"com.example.thing","defs":{"main":{"type":"object","nullable":["a"],"properties":{"a":{"type":"string"}}}}}`,
		"bytes":        `{"lexicon":1,"id":"com.example.thing","defs":{"main":{"type":"object","properties":{"a":{"type":"bytes"}}}}}`,
		"dangling ref": `{"lexicon":1,"id":"com.example.thing","defs":{"main":{"type":"object","properties":{"a":{"type":"ref","ref":"#nope"}}}}}`,
		"name clash": `{"lexicon":1,"id":"com.example.thing","defs":{"main":{"type":"object","properties":{
			"payload":{"type":"union","refs":["#a"]}}},"a":{"type":"object","properties":{}},"payload":{"type":"object","properties":{}}}}`,
		"not json": `{`,
	}
	for name, lex := range cases {
		err := gen1(t, lex)
		if err == nil {
			t.Errorf("%s: generated without an error", name)
			continue
		}
		t.Logf("%s: %v", name, err)
	}
	ok := `{"lexicon":1,"id":"com.example.thing","defs":{"main":{"type":"record","key":"tid","record":{"type":"object","properties":{"a":{"type":"string"}}}}}}`
	if err := gen1(t, ok); err != nil {
		t.Errorf("a plain record: %v", err)
	}
	if !strings.Contains(Project.LexiconsImport, "lexicons") {
		t.Error("Project config")
	}
}
