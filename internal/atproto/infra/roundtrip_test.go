package infra

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"socialweb.computer/internal/atproto/lextest"
	"socialweb.computer/lexicons"
)

const fixtures = "../../../lexicons/testdata/valid"

func TestRoundTrip(t *testing.T) {
	for name, b := range lextest.Fixtures(t, fixtures, "computer.socialweb.") {
		t.Run(name, func(t *testing.T) {
			switch lextest.Collection(name) {
			case InfraNSID:
				r, err := DecodeInfra(b)
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Validate(); err != nil {
					t.Fatal(err)
				}
				lextest.RoundTrip(t, b, new(Infra))
			case EphemeralInfraNSID:
				r, err := DecodeEphemeralInfra(b)
				if err != nil {
					t.Fatal(err)
				}
				if r.TTLSeconds != 3600 || *r.EndWhen != EphemeralInfraEndWhenComplete || r.Contracts[0].State != InfraContractStateRequested {
					t.Fatalf("decoded %+v", r)
				}
				lextest.RoundTrip(t, b, new(EphemeralInfra))
			default:
				t.Fatalf("no test for %s", name)
			}
		})
	}
}

func TestDecodeInfraFixture(t *testing.T) {
	b := lextest.Fixtures(t, fixtures, InfraNSID)[InfraNSID]
	r, err := DecodeInfra(b)
	if err != nil {
		t.Fatal(err)
	}
	c := r.Contracts[0]
	if c.Name != "builder" || *c.ComputeKind != InfraContractComputeKindDeno || *c.VMReadyTimeoutSec != 300 ||
		string(c.PolicyArgs) != `{"maxCost": 10}` || r.Status.Contracts[0].Winner == nil {
		t.Fatalf("decoded %+v", c)
	}
	idx, err := DecodeInfra(lextest.Fixtures(t, fixtures, InfraNSID+"-index")[InfraNSID+"-index"])
	if err != nil {
		t.Fatal(err)
	}
	if idx.Index == nil || len(idx.Index.Live) != 2 || idx.Contracts != nil {
		t.Fatalf("index %+v", idx)
	}
}

func TestDecodeReportsWhy(t *testing.T) {
	cases := []struct {
		json   string
		reason lexicons.Reason
		path   string
	}{
		{`{"$type":"computer.socialweb.ephemeralInfra","createdAt":"2026-11-30T11:00:00Z"}`, lexicons.BadType, "$type"},
		{`{"$type":"computer.socialweb.infra"}`, lexicons.MissingField, "createdAt"},
		{`{"$type":"computer.socialweb.infra","createdAt":"2026-11-30T11:00:00Z","contracts":[{"name":"x","state":1}]}`, lexicons.WrongType, "contracts[0].state"},
		{`{"$type":"computer.socialweb.infra","createdAt":"2026-11-30T11:00:00Z","contracts":[{"name":"` + strings.Repeat("n", 64) + `","state":"staged"}]}`, lexicons.TooLong, "contracts[0].name"},
	}
	for _, tc := range cases {
		_, err := DecodeInfra([]byte(tc.json))
		var ve *lexicons.ValidationError
		if !errors.As(err, &ve) || ve.Reason != tc.reason || ve.Path != tc.path {
			t.Errorf("%s: got %v; want %s at %s", tc.json, err, tc.reason, tc.path)
		}
	}
	if _, err := DecodeEphemeralInfra([]byte(`{"$type":"computer.socialweb.ephemeralInfra","createdAt":"2026-11-30T11:00:00Z"}`)); lexicons.ReasonOf(err) != lexicons.MissingField {
		t.Errorf("missing ttlSeconds: %v", err)
	}
}

func TestBuiltRecord(t *testing.T) {
	desc := "web"
	r := Infra{
		Description: &desc,
		Contracts:   []InfraContract{{Name: "web", State: InfraContractStateStaged}},
		CreatedAt:   "2026-11-30T11:00:00Z",
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), `{"$type":"computer.socialweb.infra",`) {
		t.Fatalf("no $type first: %s", b)
	}
	r.Contracts[0].Name = ""
	if lexicons.ReasonOf(r.Validate()) != lexicons.TooShort {
		t.Fatalf("empty name: %v", r.Validate())
	}
	// $type is checked on plain decoding too.
	var other Infra
	if err := json.Unmarshal([]byte(`{"$type":"app.bsky.feed.post","createdAt":"x"}`), &other); err == nil {
		t.Fatal("decoded a record of another $type")
	}
}
