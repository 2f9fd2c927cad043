package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	indigo "github.com/bluesky-social/indigo/atproto/atclient"

	"socialweb.computer/internal/pds/plc"
	"socialweb.computer/internal/pds/refpds"
)

// plcGet reads path of a PLC directory (the reference's stub or ours) into v.
func plcGet(t *testing.T, plcURL, path string, v any) {
	t.Helper()
	resp, err := http.Get(strings.TrimRight(plcURL, "/") + "/" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("PLC %s: %d", path, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("PLC %s: %v", path, err)
	}
}

func sortedKeys(m map[string]any) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

// plcOpScenario drives the PLC operation endpoints with indigo's client and returns one line
// per step and the firehose events of the account. token obtains the signing token: the
// reference mails it, this server's operator issues it, so requestPlcOperationSignature is not
// compared.
func plcOpScenario(ctx context.Context, t *testing.T, url, plcURL string, token func(did string, self *indigo.APIClient) string) ([]string, []string) {
	t.Helper()
	a := newAccount(ctx, t, url, "pia.test", "pia-pw", "pia@example.test")
	did, self, anon := a.did, a.self, a.anon
	add := func(step, ok string, err error) { a.add(step, ok, err) }
	var data plc.Data
	plcGet(t, plcURL, did+"/data", &data)

	var creds map[string]any
	err := anon.Get(ctx, "com.atproto.identity.getRecommendedDidCredentials", nil, &creds)
	add("getRecommendedDidCredentials (anonymous)", "", err)
	var typed struct {
		AlsoKnownAs         []string               `json:"alsoKnownAs"`
		VerificationMethods map[string]string      `json:"verificationMethods"`
		RotationKeys        []string               `json:"rotationKeys"`
		Services            map[string]plc.Service `json:"services"`
	}
	err = self.Get(ctx, "com.atproto.identity.getRecommendedDidCredentials", nil, &creds)
	raw, _ := json.Marshal(creds)
	_ = json.Unmarshal(raw, &typed)
	add("getRecommendedDidCredentials", fmt.Sprintf("{%s} alsoKnownAs=%v same as the document: %v", sortedKeys(creds), typed.AlsoKnownAs,
		reflect.DeepEqual(typed.AlsoKnownAs, data.AlsoKnownAs) && reflect.DeepEqual(typed.VerificationMethods, data.VerificationMethods) &&
			reflect.DeepEqual(typed.RotationKeys, data.RotationKeys) && reflect.DeepEqual(typed.Services, data.Services)), err)

	sign := func(step string, in map[string]any) json.RawMessage {
		var res struct {
			Operation json.RawMessage `json:"operation"`
		}
		err := self.Post(ctx, "com.atproto.identity.signPlcOperation", in, &res)
		add(step, "", err)
		return res.Operation
	}
	submit := func(step string, in map[string]any) {
		add(step, "", self.Post(ctx, "com.atproto.identity.submitPlcOperation", in, nil))
	}
	add("requestPlcOperationSignature (anonymous)", "", comatproto.IdentityRequestPlcOperationSignature(ctx, anon))
	add("signPlcOperation (anonymous)", "", anon.Post(ctx, "com.atproto.identity.signPlcOperation", map[string]any{"token": "AAAAA-AAAAA"}, nil))
	add("submitPlcOperation (anonymous)", "", anon.Post(ctx, "com.atproto.identity.submitPlcOperation", map[string]any{"operation": map[string]any{}}, nil))
	aka := []string{"at://pia.test", "https://pia.example"}
	sign("signPlcOperation without a token", map[string]any{"alsoKnownAs": aka})
	sign("signPlcOperation before any token", map[string]any{"alsoKnownAs": aka, "token": "AAAAA-AAAAA"})
	tok := token(did, self)
	sign("signPlcOperation with a wrong token", map[string]any{"alsoKnownAs": aka, "token": "AAAAA-AAAAA"})
	opRaw := sign("signPlcOperation", map[string]any{"alsoKnownAs": aka, "token": tok})
	sign("signPlcOperation with the spent token", map[string]any{"alsoKnownAs": aka, "token": tok})

	// The signed operation: its fields, prev the CID of the current operation (as our code
	// computes it), its signature good under the current rotation keys (as our directory checks).
	var opMap map[string]any
	_ = json.Unmarshal(opRaw, &opMap)
	var last plc.Op
	plcGet(t, plcURL, did+"/log/last", &last)
	op, err := plc.ParseOp(opRaw)
	if err != nil {
		t.Fatalf("signed operation %s: %v", opRaw, err)
	}
	a.note(fmt.Sprintf("signed operation: {%s} type=%s alsoKnownAs=%v rest kept: %v verifies after the current one: %v",
		sortedKeys(opMap), op.Type, op.AlsoKnownAs,
		reflect.DeepEqual(op.RotationKeys, last.RotationKeys) && reflect.DeepEqual(op.VerificationMethods, last.VerificationMethods) &&
			reflect.DeepEqual(op.Services, last.Services),
		plc.Verify(did, []*plc.Op{&last}, op)))

	mutate := func(f func(m map[string]any)) map[string]any {
		var m map[string]any
		_ = json.Unmarshal(opRaw, &m)
		f(m)
		return map[string]any{"operation": m}
	}
	submit("submitPlcOperation without operation", map[string]any{})
	submit("submitPlcOperation of a tombstone", mutate(func(m map[string]any) { m["type"] = "plc_tombstone" }))
	submit("submitPlcOperation without sig", mutate(func(m map[string]any) { delete(m, "sig") }))
	submit("submitPlcOperation without the server's rotation key", mutate(func(m map[string]any) {
		m["rotationKeys"] = []string{typed.VerificationMethods["atproto"]}
	}))
	submit("submitPlcOperation with another service type", mutate(func(m map[string]any) {
		m["services"] = map[string]any{"atproto_pds": map[string]any{"type": "Other", "endpoint": typed.Services["atproto_pds"].Endpoint}}
	}))
	submit("submitPlcOperation naming another PDS", mutate(func(m map[string]any) {
		m["services"] = map[string]any{"atproto_pds": map[string]any{"type": "AtprotoPersonalDataServer", "endpoint": "https://elsewhere.test"}}
	}))
	submit("submitPlcOperation with another signing key", mutate(func(m map[string]any) {
		m["verificationMethods"] = map[string]any{"atproto": typed.RotationKeys[0]}
	}))
	submit("submitPlcOperation with another handle first", mutate(func(m map[string]any) {
		m["alsoKnownAs"] = []string{"https://pia.example", "at://pia.test"}
	}))
	submit("submitPlcOperation", map[string]any{"operation": opMap})
	plcGet(t, plcURL, did+"/data", &data)
	a.note(fmt.Sprintf("document alsoKnownAs after submit: %v", data.AlsoKnownAs))
	_, err = comatproto.IdentityResolveHandle(ctx, anon, "pia.test")
	add("resolveHandle after submit", "", err)

	// The four events of a new account and the #identity of the submit.
	return a.out, follow(ctx, t, url).lines(did, 5, nil)
}

func TestInteropPLCOperations(t *testing.T) {
	peer := refpds.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	want, wantFire := plcOpScenario(ctx, t, peer.PDSURL, peer.PLCURL, mailedToken(ctx, t, peer, "plc_operation"))
	ours := startOurs(t)
	got, gotFire := plcOpScenario(ctx, t, ours.URL(), ours.PLCURL(), func(did string, self *indigo.APIClient) string {
		err := comatproto.IdentityRequestPlcOperationSignature(ctx, self)
		if observeIndigo(err) != "400 InvalidRequest this server sends no email: ask its operator for a PLC operation token" {
			t.Errorf("requestPlcOperationSignature: %v", err)
		}
		tok, err := ours.RequestPLCOperationSignature(ctx, did)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	})
	compareLines(t, want, got)
	compareLines(t, wantFire, gotFire)
}
