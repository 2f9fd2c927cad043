package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/pds/plc"
)

func TestMergeOp(t *testing.T) {
	last := &plc.Op{Type: plc.TypeOperation, RotationKeys: []string{"did:key:r1"}, AlsoKnownAs: []string{"at://a.test", "https://a.example"},
		VerificationMethods: map[string]string{"atproto": "did:key:s1"},
		Services:            map[string]plc.Service{"atproto_pds": {Type: pdsServiceType, Endpoint: "http://old"}}, Sig: "x"}
	keep := plc.Op{Type: plc.TypeOperation, RotationKeys: last.RotationKeys, AlsoKnownAs: last.AlsoKnownAs,
		VerificationMethods: last.VerificationMethods, Services: last.Services}
	with := func(f func(*plc.Op)) plc.Op { o := keep; f(&o); return o }
	for _, tc := range []struct {
		name string
		in   PLCOpFields
		want plc.Op
	}{
		{"nothing given keeps every field (and drops sig)", PLCOpFields{}, keep},
		{"rotation keys replace the list whole", PLCOpFields{RotationKeys: []string{"did:key:r2", "did:key:r1"}},
			with(func(o *plc.Op) { o.RotationKeys = []string{"did:key:r2", "did:key:r1"} })},
		{"an empty list is given, not absent", PLCOpFields{AlsoKnownAs: []string{}},
			with(func(o *plc.Op) { o.AlsoKnownAs = []string{} })},
		{"verification methods replace the map whole", PLCOpFields{VerificationMethods: map[string]string{"other": "did:key:o"}},
			with(func(o *plc.Op) { o.VerificationMethods = map[string]string{"other": "did:key:o"} })},
		{"services replace the map whole", PLCOpFields{Services: map[string]plc.Service{"atproto_pds": {Type: pdsServiceType, Endpoint: "http://new"}}},
			with(func(o *plc.Op) {
				o.Services = map[string]plc.Service{"atproto_pds": {Type: pdsServiceType, Endpoint: "http://new"}}
			})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mergeOp(last, tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestCheckSubmittedOp(t *testing.T) {
	want := submitExpect{RotationKey: "did:key:rot", Endpoint: "https://pds.test", SigningKey: "did:key:sig", Handle: "a.test"}
	good := func() *plc.Op {
		return &plc.Op{Type: plc.TypeOperation, RotationKeys: []string{"did:key:other", "did:key:rot"},
			VerificationMethods: map[string]string{"atproto": "did:key:sig"}, AlsoKnownAs: []string{"at://a.test", "at://b.test"},
			Services: map[string]plc.Service{"atproto_pds": {Type: pdsServiceType, Endpoint: "https://pds.test"}}}
	}
	for _, tc := range []struct {
		name   string
		change func(*plc.Op)
		want   submitExpect
		err    string
	}{
		{"keeps everything", func(*plc.Op) {}, want, ""},
		{"no handle on the account: alsoKnownAs is free", func(o *plc.Op) { o.AlsoKnownAs = nil }, submitExpect{RotationKey: "did:key:rot", Endpoint: "https://pds.test", SigningKey: "did:key:sig"}, ""},
		{"drops the server's rotation key", func(o *plc.Op) { o.RotationKeys = []string{"did:key:other"} }, want, "Rotation keys do not include server's rotation key"},
		{"no atproto_pds service", func(o *plc.Op) { o.Services = map[string]plc.Service{} }, want, "Incorrect type on atproto_pds service"},
		{"wrong service type", func(o *plc.Op) {
			o.Services = map[string]plc.Service{"atproto_pds": {Type: "Other", Endpoint: "https://pds.test"}}
		}, want, "Incorrect type on atproto_pds service"},
		{"another endpoint", func(o *plc.Op) {
			o.Services = map[string]plc.Service{"atproto_pds": {Type: pdsServiceType, Endpoint: "https://elsewhere.test"}}
		}, want, "Incorrect endpoint on atproto_pds service"},
		{"another signing key", func(o *plc.Op) { o.VerificationMethods = map[string]string{"atproto": "did:key:new"} }, want, "Incorrect signing key"},
		{"handle not first", func(o *plc.Op) { o.AlsoKnownAs = []string{"at://b.test", "at://a.test"} }, want, "Incorrect handle in alsoKnownAs"},
		{"no alsoKnownAs", func(o *plc.Op) { o.AlsoKnownAs = nil }, want, "Incorrect handle in alsoKnownAs"},
		{"rotation key checked first", func(o *plc.Op) { o.RotationKeys = nil; o.VerificationMethods = nil }, want, "Rotation keys do not include server's rotation key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			op := good()
			tc.change(op)
			err := checkSubmittedOp(op, tc.want)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tc.err) || (tc.err == "") != (err == nil) {
				t.Fatalf("got %q, want %q", got, tc.err)
			}
		})
	}
}

func TestParseSubmittedOp(t *testing.T) {
	const full = `{"type":"plc_operation","rotationKeys":["did:key:r"],"verificationMethods":{"atproto":"did:key:s"},` +
		`"alsoKnownAs":["at://a.test"],"services":{"atproto_pds":{"type":"AtprotoPersonalDataServer","endpoint":"http://x"}},"prev":"bafy","sig":"abc"}`
	op, err := parseSubmittedOp(json.RawMessage(full))
	if err != nil || op.Prev == nil || *op.Prev != "bafy" || op.Sig != "abc" || op.Services["atproto_pds"].Endpoint != "http://x" {
		t.Fatalf("full op: %+v %v", op, err)
	}
	if op, err := parseSubmittedOp(json.RawMessage(strings.Replace(full, `"bafy"`, "null", 1))); err != nil || op.Prev != nil {
		t.Fatalf("prev null: %+v %v", op, err)
	}
	for _, bad := range []string{
		`null`, `[]`, `"op"`, `{}`,
		strings.Replace(full, `"plc_operation"`, `"plc_tombstone"`, 1),
		strings.Replace(full, `"type":"plc_operation",`, ``, 1),
		strings.Replace(full, `,"prev":"bafy"`, ``, 1),
		strings.Replace(full, `,"sig":"abc"`, ``, 1),
		strings.Replace(full, `"prev":"bafy"`, `"prev":1`, 1),
		strings.Replace(full, `["did:key:r"]`, `"did:key:r"`, 1),
		strings.Replace(full, `{"atproto":"did:key:s"}`, `{"atproto":1}`, 1),
		strings.Replace(full, `{"type":"AtprotoPersonalDataServer","endpoint":"http://x"}`, `{}`, 1),
		strings.Replace(full, `{"type":"AtprotoPersonalDataServer","endpoint":"http://x"}`, `"x"`, 1),
	} {
		if _, err := parseSubmittedOp(json.RawMessage(bad)); err == nil || !strings.Contains(err.Error(), "Invalid operation") {
			t.Errorf("accepted %s: %v", bad, err)
		}
	}
}

// call posts in to method and decodes the answer (or the error name) into out.
func call(t *testing.T, s *Server, method, access string, in, out any) (int, string) {
	t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	verb := "POST"
	if method == "com.atproto.identity.getRecommendedDidCredentials" {
		verb = "GET"
	}
	req, _ := http.NewRequest(verb, s.URL()+"/xrpc/"+method, body)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if access != "" {
		req.Header.Set("Authorization", "Bearer "+access)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		var e struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(raw, &e)
		return resp.StatusCode, e.Error + " " + e.Message
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s answer %s: %v", method, raw, err)
		}
	}
	return 200, ""
}

func TestPLCOperationFlow(t *testing.T) {
	ctx := context.Background()
	clock := &manualClock{t: time.Now()}
	s := startTestServer(t, clock)
	did, access := testAccount(t, s, "pat.test")
	expect := func(step string, st int, msg string, wantSt int, wantMsg string) {
		t.Helper()
		if st != wantSt || !strings.HasPrefix(msg, wantMsg) {
			t.Fatalf("%s: %d %q, want %d %q", step, st, msg, wantSt, wantMsg)
		}
	}

	var creds DIDCredentials
	st, msg := call(t, s, "com.atproto.identity.getRecommendedDidCredentials", "", nil, nil)
	expect("credentials without a session", st, msg, 401, "AuthMissing")
	st, msg = call(t, s, "com.atproto.identity.getRecommendedDidCredentials", access, nil, &creds)
	expect("credentials", st, msg, 200, "")
	last, err := s.plc.Last(ctx, did)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(creds.RotationKeys, last.RotationKeys) || !reflect.DeepEqual(creds.VerificationMethods, last.VerificationMethods) ||
		!reflect.DeepEqual(creds.Services, last.Services) || !reflect.DeepEqual(creds.AlsoKnownAs, last.AlsoKnownAs) {
		t.Fatalf("recommended %+v, document %+v", creds, last)
	}

	st, msg = call(t, s, "com.atproto.identity.requestPlcOperationSignature", access, nil, nil)
	expect("request without an email address", st, msg, 400, "InvalidRequest account does not have an email address")
	sign := map[string]any{"alsoKnownAs": []string{"at://pat.test", "https://pat.example"}}
	st, msg = call(t, s, "com.atproto.identity.signPlcOperation", access, sign, nil)
	expect("sign without a token", st, msg, 400, "InvalidRequest email confirmation token required")
	sign["token"] = "AAAAA-AAAAA"
	st, msg = call(t, s, "com.atproto.identity.signPlcOperation", access, sign, nil)
	expect("sign before any token", st, msg, 400, "InvalidToken")

	// A token for another purpose is no PLC operation token.
	delTok, err := s.RequestAccountDelete(ctx, did)
	if err != nil {
		t.Fatal(err)
	}
	sign["token"] = delTok
	st, msg = call(t, s, "com.atproto.identity.signPlcOperation", access, sign, nil)
	expect("sign with a deletion token", st, msg, 400, "InvalidToken")
	tok, err := s.RequestPLCOperationSignature(ctx, did)
	if err != nil {
		t.Fatal(err)
	}
	sign["token"] = "AAAAA-AAAAA"
	st, msg = call(t, s, "com.atproto.identity.signPlcOperation", access, sign, nil)
	expect("sign with a wrong token", st, msg, 400, "InvalidToken")
	sign["verificationMethods"] = "did:key:x"
	sign["token"] = tok
	st, msg = call(t, s, "com.atproto.identity.signPlcOperation", access, sign, nil)
	expect("sign with malformed verificationMethods", st, msg, 400, "InvalidRequest verificationMethods")
	delete(sign, "verificationMethods")
	clock.Add(16 * time.Minute)
	st, msg = call(t, s, "com.atproto.identity.signPlcOperation", access, sign, nil)
	expect("sign with an expired token", st, msg, 400, "ExpiredToken")
	if tok, err = s.RequestPLCOperationSignature(ctx, did); err != nil {
		t.Fatal(err)
	}
	sign["token"] = strings.ToLower(tok)
	var signed struct {
		Operation json.RawMessage `json:"operation"`
	}
	st, msg = call(t, s, "com.atproto.identity.signPlcOperation", access, sign, &signed)
	expect("sign (token in lower case)", st, msg, 200, "")
	st, msg = call(t, s, "com.atproto.identity.signPlcOperation", access, sign, nil)
	expect("sign again with the spent token", st, msg, 400, "InvalidToken")
	op, err := plc.ParseOp(signed.Operation)
	if err != nil {
		t.Fatalf("signed operation %s: %v", signed.Operation, err)
	}
	head, _ := last.CID()
	if op.Prev == nil || *op.Prev != head.String() || !reflect.DeepEqual(op.AlsoKnownAs, []string{"at://pat.test", "https://pat.example"}) ||
		!reflect.DeepEqual(op.RotationKeys, last.RotationKeys) || !reflect.DeepEqual(op.Services, last.Services) {
		t.Fatalf("signed %+v after %+v", op, last)
	}
	// Signing submits nothing.
	if now, _ := s.plc.Last(ctx, did); now.Sig != last.Sig {
		t.Fatal("signPlcOperation changed the document")
	}

	mutate := func(f func(m map[string]any)) map[string]any {
		var m map[string]any
		_ = json.Unmarshal(signed.Operation, &m)
		f(m)
		return map[string]any{"operation": m}
	}
	for _, tc := range []struct {
		step string
		in   any
		want string
	}{
		{"submit without operation", map[string]any{}, "InvalidRequest Missing required key \"operation\" at $"},
		{"submit a tombstone", mutate(func(m map[string]any) { m["type"] = "plc_tombstone" }), "InvalidRequest Invalid operation"},
		{"submit without the server's rotation key", mutate(func(m map[string]any) { m["rotationKeys"] = []string{creds.VerificationMethods["atproto"]} }), "InvalidRequest Rotation keys do not include"},
		{"submit naming another PDS", mutate(func(m map[string]any) {
			m["services"] = map[string]any{"atproto_pds": map[string]any{"type": pdsServiceType, "endpoint": "https://elsewhere.test"}}
		}), "InvalidRequest Incorrect endpoint on atproto_pds service"},
		{"submit another signing key", mutate(func(m map[string]any) { m["verificationMethods"] = map[string]any{"atproto": creds.RotationKeys[0]} }), "InvalidRequest Incorrect signing key"},
		{"submit another handle", mutate(func(m map[string]any) { m["alsoKnownAs"] = []string{"at://other.test"} }), "InvalidRequest Incorrect handle in alsoKnownAs"},
		{"submit with a broken signature", mutate(func(m map[string]any) { m["alsoKnownAs"] = []string{"at://pat.test"} }), "InvalidRequest the PLC directory refused the operation: Invalid signature"},
	} {
		st, msg := call(t, s, "com.atproto.identity.submitPlcOperation", access, tc.in, nil)
		expect(tc.step, st, msg, 400, tc.want)
	}
	st, msg = call(t, s, "com.atproto.identity.submitPlcOperation", access, map[string]any{"operation": signed.Operation}, nil)
	expect("submit", st, msg, 200, "")
	got, err := s.plc.Last(ctx, did)
	if err != nil || got.Sig != op.Sig {
		t.Fatalf("document after submit: %+v %v", got, err)
	}
	// The last event of the account is #identity, without a handle.
	var lastEv *firehose.Event
	zero := int64(0)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_ = s.Subscribe(sctx, &zero, func(ev *firehose.Event) error {
		if ev.DID() == did {
			lastEv = ev
		}
		return nil
	})
	if lastEv == nil || lastEv.Identity == nil || lastEv.Identity.Handle != nil {
		t.Fatalf("last event %+v", lastEv)
	}
	// The operation is the head now: submitting it again is refused by the directory.
	st, msg = call(t, s, "com.atproto.identity.submitPlcOperation", access, map[string]any{"operation": signed.Operation}, nil)
	expect("submit again", st, msg, 400, "InvalidRequest the PLC directory refused the operation")
}
