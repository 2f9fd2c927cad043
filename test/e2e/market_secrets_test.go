package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// A guest that prints the sha256 and length of its secret "token", then runs until stopped.
const secretGuest = `
const dir = Deno.env.get("SOCIALWEB_SECRETS_DIR");
const v = await Deno.readFile(dir + "/token");
const h = new Uint8Array(await crypto.subtle.digest("SHA-256", v));
console.log("secret sha256 " + Array.from(h, (b) => b.toString(16).padStart(2, "0")).join("") + " len " + v.length);
setInterval(() => {}, 1000);
`

// secretsEnv is a market env whose controllers and bidder log at debug level into logs.
func secretsEnv(t *testing.T) (*testenv.Env, *runningBidder, *testenv.LogBuffer) {
	t.Helper()
	logs := &testenv.LogBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	env := testenv.Start(t, testenv.Options{PDS: true})
	env.StartControllers(t, log)
	localRepo(t, env, "owner")
	const handle = "secretbidder.test"
	if _, err := env.PDS.CreateAccount(context.Background(), handle, "pw-"+handle); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "guests")
	sub, err := deno.New(deno.Config{StateDir: dir})
	if err != nil || sub.Binary() == "" {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	repo, err := repos.Local(context.Background(), env.PDS, handle)
	if err != nil {
		t.Fatal(err)
	}
	b := bidder.New(bidder.Config{Repo: repo, Fetch: feed.Local(env.PDS), Substrate: sub, Cost: 1,
		Directory: env.PDS.Directory(), Log: log})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = b.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	substratetest.Cleanup(t, sub, dir)
	testenv.Eventually(t, 10*time.Second, "bidder endpoint", func() (bool, error) { return b.EndpointURL() != "", nil })
	return env, &runningBidder{Bidder: b, sub: sub, stateDir: dir, stop: stop}, logs
}

func newSecret(t *testing.T, env *testenv.Env, name string, data map[string][]byte) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}
	if err := env.Client.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

func guestLog(t *testing.T, b *runningBidder, accept string) string {
	t.Helper()
	out, err := b.sub.Logs(context.Background(), bidder.GuestID(accept), 0)
	if err != nil {
		return ""
	}
	return string(out)
}

// pdsBytes is every byte the PDS holds that others can read: each account's whole repo
// (every record version, as a CAR) and the firehose from the first frame.
func pdsBytes(t *testing.T, srv *pds.Server, dids ...string) []byte {
	t.Helper()
	var all bytes.Buffer
	c := atclient.New(srv.URL())
	for _, did := range dids {
		car, err := c.GetRepo(context.Background(), did)
		if err != nil {
			t.Fatalf("getRepo %s: %v", did, err)
		}
		all.Write(car)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var zero int64
	_ = srv.SubscribeFrames(ctx, &zero, func(f pds.Frame) error { all.Write(f.Data); return nil })
	return all.Bytes()
}

// The value of spec.secretsRef reaches the winner's guest (it prints its sha256 and length)
// and appears in no record, firehose frame, log line, status or event.
func TestACC_MarketSecretsReachOnlyTheGuest(t *testing.T) {
	env, b, logs := secretsEnv(t)
	value := fmt.Sprintf("s3cret-%d-do-not-leak", time.Now().UnixNano())
	newContract(t, env, "sec", func(c *v1alpha1.ComputeContract) {
		c.Spec.UserData = secretGuest
		c.Spec.SecretsRef = &v1alpha1.SecretKeyRef{Name: "app"}
		c.Spec.PolicyArgs["bidWindowSec"] = "2"
	})
	// No Secret yet: no rfp, Pending, and the condition says why.
	testenv.Eventually(t, 10*time.Second, "SecretUnavailable", func() (bool, error) {
		var c v1alpha1.ComputeContract
		if err := env.Client.Get(context.Background(), key("sec"), &c); err != nil {
			return false, err
		}
		cond := meta.FindStatusCondition(c.Status.Conditions, string(v1alpha1.ConditionSecretsDelivered))
		if c.Status.RFP != "" {
			t.Fatalf("rfp written without the Secret: %s", statusJSON(c.Status))
		}
		return c.Status.Phase == v1alpha1.ComputeContractPending && cond != nil && cond.Reason == "SecretUnavailable" &&
			strings.Contains(cond.Message, "no Secret default/app"), fmt.Errorf("status %s", statusJSON(c.Status))
	})
	newSecret(t, env, "app", map[string][]byte{"token": []byte(value)})
	c := waitContract(t, env, "sec", v1alpha1.ComputeContractHeld)
	if c.Status.Winner != b.DID() {
		t.Fatalf("winner %s, want %s", c.Status.Winner, b.DID())
	}
	if !meta.IsStatusConditionTrue(c.Status.Conditions, string(v1alpha1.ConditionSecretsDelivered)) {
		t.Fatalf("Held without SecretsDelivered: %+v", c.Status.Conditions)
	}
	sum := sha256.Sum256([]byte(value))
	want := fmt.Sprintf("secret sha256 %s len %d", hex.EncodeToString(sum[:]), len(value))
	testenv.Eventually(t, 15*time.Second, "the guest prints the secret's hash", func() (bool, error) {
		l := guestLog(t, b, c.Status.Accept)
		return strings.Contains(l, want), fmt.Errorf("guest log %q", l)
	})

	b64 := base64.StdEncoding.EncodeToString([]byte(value))
	leaks := func(where string, data []byte) {
		t.Helper()
		for _, form := range []string{value, b64} {
			if bytes.Contains(data, []byte(form)) {
				t.Errorf("the secret (%q form) appears in %s", form[:8], where)
			}
		}
	}
	// The payload names the secret but carries no value.
	recs, _, err := env.PDS.ListRecords(context.Background(), env.Account.DID, mk.ComputeVMNSID, 100, "", false)
	if err != nil || len(recs) != 1 || !strings.Contains(string(recs[0].Value), `"secrets":["token"]`) {
		t.Fatalf("compute.vm payload %+v (%v): want the secret's name only", recs, err)
	}
	leaks("a PDS record or firehose frame", pdsBytes(t, env.PDS, env.Account.DID, b.DID()))
	leaks("the guest's log", []byte(guestLog(t, b, c.Status.Accept)))
	cj, _ := json.Marshal(c)
	leaks("the ComputeContract (status, conditions, events)", cj)
	if !strings.Contains(logs.String(), "computecontract_secrets_delivered") || !strings.Contains(logs.String(), "market_secrets_delivered") {
		t.Fatalf("log capture is not the components' log:\n%s", logs.String())
	}
	release(t, env, "sec")
	waitContract(t, env, "sec", v1alpha1.ComputeContractReleased)
	waitNoProcs(t, b.stateDir)
	leaks("a log line", []byte(logs.String()))
	leaks("a PDS record or firehose frame after the release", pdsBytes(t, env.PDS, env.Account.DID, b.DID()))
}

// deliverCall posts a deliverSecrets call with token (none when "") and returns the status
// and XRPC error name.
func deliverCall(t *testing.T, endpoint, token string, in mk.DeliverSecretsInput) (int, string) {
	t.Helper()
	body, _ := json.Marshal(in)
	req, _ := http.NewRequest(http.MethodPost, endpoint+"/xrpc/"+mk.DeliverSecretsNSID, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var xe struct{ Error string }
	_ = json.Unmarshal(raw, &xe)
	return resp.StatusCode, xe.Error
}

// The bidder's deliverSecrets endpoint refuses a call without a token, with a token for
// another audience or method, from another DID than the accept's author, or replayed; none of
// them delivers anything: the guest does not boot until the requester's own call.
func TestACC_MarketSecretsEndpointRefuses(t *testing.T) {
	env, b, logs := secretsEnv(t)
	ctx := context.Background()
	if _, err := env.PDS.CreateAccount(ctx, "mallory.test", "pw-mallory"); err != nil {
		t.Fatal(err)
	}
	mallory, _, err := env.PDS.Account(ctx, "mallory.test")
	if err != nil {
		t.Fatal(err)
	}
	value := fmt.Sprintf("real-%d", time.Now().UnixNano())
	// The requester's side is written by hand, so the winner waits for the secrets for as long
	// as the test needs.
	m := requestByHand(t, env, b, []string{"token"})
	poison := "poison-" + value
	in := mk.DeliverSecretsInput{Accept: m.accept, Secrets: []mk.DeliverSecretsSecret{{Name: "token", Value: base64.StdEncoding.EncodeToString([]byte(poison))}}}
	tok := func(did, aud, lxm string) string {
		t.Helper()
		s, err := env.PDS.ServiceAuth(ctx, did, aud, lxm, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	owner := env.Account.DID
	ep := b.EndpointURL()
	replayed := tok(owner, b.DID(), mk.DeliverSecretsNSID)
	for _, tc := range []struct {
		name, token string
		in          mk.DeliverSecretsInput
		status      int
		xerr        string
	}{
		{"no token", "", in, 401, "AuthMissing"},
		{"garbage token", "not.a.jwt", in, 401, "BadJwtSignature"},
		{"wrong aud", tok(owner, mallory, mk.DeliverSecretsNSID), in, 401, "BadJwtAudience"},
		{"wrong lxm", tok(owner, b.DID(), mk.OfferingNSID), in, 401, "BadJwtLexiconMethod"},
		{"no lxm", tok(owner, b.DID(), ""), in, 401, "BadJwtLexiconMethod"},
		{"another DID than the requester", tok(mallory, b.DID(), mk.DeliverSecretsNSID), in, 403, "NotRequester"},
		{"an accept that is not waiting", replayed, mk.DeliverSecretsInput{Accept: m.rfp, Secrets: in.Secrets}, 400, "UnknownAccept"},
		{"replayed token", replayed, in, 401, "JwtReplayed"},
		{"names not the payload's", tok(owner, b.DID(), mk.DeliverSecretsNSID), mk.DeliverSecretsInput{Accept: m.accept,
			Secrets: []mk.DeliverSecretsSecret{{Name: "other", Value: "eA=="}}}, 400, "InvalidSecrets"},
		{"a name that is a path", tok(owner, b.DID(), mk.DeliverSecretsNSID), mk.DeliverSecretsInput{Accept: m.accept,
			Secrets: []mk.DeliverSecretsSecret{{Name: "../token", Value: "eA=="}}}, 400, "InvalidSecrets"},
	} {
		status, xerr := deliverCall(t, ep, tc.token, tc.in)
		if status != tc.status || (xerr != tc.xerr && !(tc.name == "garbage token" && strings.HasPrefix(xerr, "BadJwt"))) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, status, xerr, tc.status, tc.xerr)
		}
	}
	for name, body := range map[string]string{"not JSON": "{not json" + poison, "a number for the secrets": `{"accept":"x","secrets":5}`,
		"too large": `{"accept":"` + strings.Repeat("a", 7<<20) + `"}`} {
		req, _ := http.NewRequest(http.MethodPost, ep+"/xrpc/"+mk.DeliverSecretsNSID, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok(owner, b.DID(), mk.DeliverSecretsNSID))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// A body over the endpoint's limit is 413 PayloadTooLarge, as on every XRPC server;
		// the others are 400 InvalidRequest.
		status, xerr := 400, "InvalidRequest"
		if name == "too large" {
			status, xerr = 413, "PayloadTooLarge"
		}
		if resp.StatusCode != status || !strings.Contains(string(raw), `"error":"`+xerr+`"`) || strings.Contains(string(raw), "poison") {
			t.Errorf("%s: %d %s, want %d %s", name, resp.StatusCode, raw, status, xerr)
		}
	}
	if n := running(t, b); n != 0 {
		t.Fatalf("%d guest(s) booted after refused calls", n)
	}
	// The requester's own call boots the guest with the real value, not the refused poison.
	real := mk.DeliverSecretsInput{Accept: m.accept, Secrets: []mk.DeliverSecretsSecret{{Name: "token", Value: base64.StdEncoding.EncodeToString([]byte(value))}}}
	if status, xerr := deliverCall(t, ep, tok(owner, b.DID(), mk.DeliverSecretsNSID), real); status != 200 {
		t.Fatalf("the requester's delivery: %d %s", status, xerr)
	}
	// Repeated after success: taken, nothing changes; from another DID still refused.
	if status, xerr := deliverCall(t, ep, tok(owner, b.DID(), mk.DeliverSecretsNSID), in); status != 200 {
		t.Fatalf("a repeated delivery: %d %s", status, xerr)
	}
	if status, xerr := deliverCall(t, ep, tok(mallory, b.DID(), mk.DeliverSecretsNSID), in); status != 403 || xerr != "NotRequester" {
		t.Fatalf("another DID after the delivery: %d %s", status, xerr)
	}
	sum := sha256.Sum256([]byte(value))
	want := fmt.Sprintf("secret sha256 %s len %d", hex.EncodeToString(sum[:]), len(value))
	testenv.Eventually(t, 15*time.Second, "the guest prints the real secret's hash", func() (bool, error) {
		l := guestLog(t, b, m.accept)
		return strings.Contains(l, want), fmt.Errorf("guest log %q", l)
	})
	if strings.Contains(logs.String(), poison) || strings.Contains(logs.String(), value) {
		t.Fatal("a secret value in a log line")
	}
	m.release(t)
	waitNoProcs(t, b.stateDir)
}

// A contract released while its winner still waits for the secrets ends at once: the winner
// writes its final event and never boots the guest.
func TestACC_MarketSecretsReleasedBeforeDelivery(t *testing.T) {
	env, b, _ := secretsEnv(t)
	m := requestByHand(t, env, b, []string{"token"})
	m.release(t)
	if n := running(t, b); n != 0 || len(substratetest.Procs(b.stateDir)) != 0 {
		t.Fatalf("%d guest(s) booted for a contract released before its secrets", n)
	}
	status, xerr := deliverCall(t, b.EndpointURL(), func() string {
		s, _ := env.PDS.ServiceAuth(context.Background(), env.Account.DID, b.DID(), mk.DeliverSecretsNSID, time.Minute)
		return s
	}(), mk.DeliverSecretsInput{Accept: m.accept, Secrets: []mk.DeliverSecretsSecret{{Name: "token", Value: "eA=="}}})
	if status != 400 || xerr != "UnknownAccept" {
		t.Fatalf("a delivery after the release: %d %s, want 400 UnknownAccept", status, xerr)
	}
}

// handMarket is a contract whose requester side the test writes itself, from the owner repo.
type handMarket struct {
	env         *testenv.Env
	bidder      string // the winner's DID
	repo        repos.Repo
	rfp, accept string
	receipt     repos.Record
}

// requestByHand writes a compute.vm payload naming secrets, an open policy and an rfp, waits
// for b's bid, accepts it and waits for the receipt.
func requestByHand(t *testing.T, env *testenv.Env, b *runningBidder, secrets []string) *handMarket {
	t.Helper()
	return requestByHandFrom(t, env, b.DID(), secrets)
}

// requestByHandFrom is requestByHand with a bidder known by its DID only.
func requestByHandFrom(t *testing.T, env *testenv.Env, bidderDID string, secrets []string) *handMarket {
	t.Helper()
	ctx := context.Background()
	repo, err := repos.Local(ctx, env.PDS, env.Account.DID)
	if err != nil {
		t.Fatal(err)
	}
	put := func(coll string, v any) repos.Record {
		t.Helper()
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		w, err := repo.Put(ctx, coll, feed.TID(), raw, nil)
		if err != nil {
			t.Fatalf("%s: %v", coll, err)
		}
		return repos.Record{URI: w.URI, CID: w.CID}
	}
	kind, ud := "deno", secretGuest
	pay := put(mk.ComputeVMNSID, mk.ComputeVM{ComputeKind: &kind, Cpus: 1, Mem: 256, UserData: &ud, Secrets: secrets})
	pol := put(mk.PoliciesOpenNSID, mk.PoliciesOpen{})
	rfp := put(mk.RFPNSID, mk.RFP{CreatedAt: time.Now().UTC().Format(time.RFC3339Nano),
		Payload: atrepo.StrongRef{URI: pay.URI, CID: pay.CID}, Policy: atrepo.StrongRef{URI: pol.URI, CID: pol.CID}})
	find := func(coll, what string, match func(json.RawMessage) bool) repos.Record {
		t.Helper()
		var found repos.Record
		testenv.Eventually(t, 20*time.Second, what, func() (bool, error) {
			recs, _, err := env.PDS.ListRecords(ctx, bidderDID, coll, 100, "", false)
			for _, r := range recs {
				if match(r.Value) {
					found = repos.Record{URI: r.URI, CID: r.CID, Value: r.Value}
					return true, nil
				}
			}
			return false, err
		})
		return found
	}
	bid := find(mk.BidNSID, "the bid", func(v json.RawMessage) bool {
		x, err := mk.DecodeBid(v)
		return err == nil && x.RFP.URI == rfp.URI
	})
	acc := put(mk.AcceptNSID, mk.Accept{Bid: atrepo.StrongRef{URI: bid.URI, CID: bid.CID}, RFP: atrepo.StrongRef{URI: rfp.URI, CID: rfp.CID}})
	rc := find(mk.ReceiptNSID, "the receipt", func(v json.RawMessage) bool {
		x, err := mk.DecodeReceipt(v)
		return err == nil && x.Accept.URI == acc.URI
	})
	return &handMarket{env: env, bidder: bidderDID, repo: repo, rfp: rfp.URI, accept: acc.URI, receipt: rc}
}

// release writes the requester's delete event and waits for the winner's final one.
func (m *handMarket) release(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	reason := "test done"
	raw, _ := json.Marshal(mk.Event{Receipt: atrepo.StrongRef{URI: m.receipt.URI, CID: m.receipt.CID},
		Payload: mk.EventPayload{ComputeEventsVMDelete: &mk.ComputeEventsVMDelete{Reason: &reason}}})
	if _, err := m.repo.Put(ctx, mk.EventNSID, feed.TID(), raw, nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the winner's final event", func() (bool, error) {
		recs, _, err := m.env.PDS.ListRecords(ctx, m.bidder, mk.EventNSID, 100, "", false)
		for _, r := range recs {
			if e, err := mk.DecodeEvent(r.Value); err == nil && e.Receipt.URI == m.receipt.URI && e.Payload.ComputeEventsVMDelete != nil {
				return true, nil
			}
		}
		return false, err
	})
}

// The real `socialweb bidder` binary serves deliverSecrets on 127.0.0.1, resolves the
// requester through --plc-url, and its guest gets the secret; its log holds no value.
func TestACC_MarketBidderCommandSecrets(t *testing.T) {
	env := marketEnv(t)
	ctx := context.Background()
	if _, err := env.PDS.CreateAccount(ctx, "clisec.test", "pw-clisec"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte("pw-clisec\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	cmd := exec.Command(socialwebBin, "bidder", "--pds", env.PDS.URL(), "--identifier", "clisec.test",
		"--password-file", pwFile, "--state-dir", state, "--cost", "3", "--log-level", "debug", "--plc-url", env.PDS.PLCURL())
	out := &testenv.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if pids := substratetest.Procs(filepath.Join(state, "guests")); len(pids) != 0 {
			t.Errorf("guest processes left: %v", pids)
		}
	})
	value := fmt.Sprintf("cli-secret-%d", time.Now().UnixNano())
	newSecret(t, env, "app", map[string][]byte{"token": []byte(value)})
	newContract(t, env, "clisec", func(c *v1alpha1.ComputeContract) {
		c.Spec.UserData = secretGuest
		c.Spec.SecretsRef = &v1alpha1.SecretKeyRef{Name: "app", Key: "token"}
	})
	c := waitContract(t, env, "clisec", v1alpha1.ComputeContractHeld)
	sub, err := deno.New(deno.Config{StateDir: filepath.Join(state, "guests")})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(value))
	want := fmt.Sprintf("secret sha256 %s len %d", hex.EncodeToString(sum[:]), len(value))
	testenv.Eventually(t, 15*time.Second, "the guest prints the secret's hash", func() (bool, error) {
		l, _ := sub.Logs(ctx, bidder.GuestID(c.Status.Accept), 0)
		return strings.Contains(string(l), want), fmt.Errorf("guest log %q", l)
	})
	release(t, env, "clisec")
	waitContract(t, env, "clisec", v1alpha1.ComputeContractReleased)
	waitNoProcs(t, filepath.Join(state, "guests"))
	if !strings.Contains(out.String(), "market_secrets_delivered") {
		t.Fatalf("the bidder's log does not show the delivery:\n%s", out.String())
	}
	if strings.Contains(out.String(), value) || strings.Contains(out.String(), base64.StdEncoding.EncodeToString([]byte(value))) {
		t.Fatal("the secret value in the bidder's log")
	}
}

// An Infra's spec.secrets reaches its contract's guest: the ComputeContract gets secretsRef,
// the guest prints the secret's hash, and neither the infra record nor any other record or
// frame holds the value. Deleting the Infra leaves no guest.
func TestACC_MarketInfraSecrets(t *testing.T) {
	env, b, logs := secretsEnv(t)
	ctx := context.Background()
	value := fmt.Sprintf("infra-secret-%d", time.Now().UnixNano())
	newSecret(t, env, "app", map[string][]byte{"token": []byte(value)})
	inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: v1alpha1.InfraSpec{Description: "with a secret", Record: &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "owner"}},
			Contracts: []v1alpha1.InfraContract{{Name: "api", State: v1alpha1.ContractRequested, ComputeKind: "deno", UserData: secretGuest,
				PolicyArgs: map[string]string{"bidWindowSec": "2"}}},
			Secrets: []v1alpha1.InfraContractSecret{{Contract: "api", SecretRef: v1alpha1.SecretKeyRef{Name: "app"}}}}}
	if err := env.Client.Create(ctx, inf); err != nil {
		t.Fatal(err)
	}
	var held v1alpha1.ComputeContract
	testenv.Eventually(t, 30*time.Second, "the Infra's contract Held", func() (bool, error) {
		var l v1alpha1.ComputeContractList
		if err := env.Client.List(ctx, &l); err != nil {
			return false, err
		}
		for _, c := range l.Items {
			if c.Spec.SecretsRef != nil && c.Spec.SecretsRef.Name == "app" && c.Status.Phase == v1alpha1.ComputeContractHeld {
				held = c
				return true, nil
			}
		}
		return false, fmt.Errorf("contracts %+v", l.Items)
	})
	sum := sha256.Sum256([]byte(value))
	want := fmt.Sprintf("secret sha256 %s len %d", hex.EncodeToString(sum[:]), len(value))
	testenv.Eventually(t, 15*time.Second, "the guest prints the secret's hash", func() (bool, error) {
		l := guestLog(t, b, held.Status.Accept)
		return strings.Contains(l, want), fmt.Errorf("guest log %q", l)
	})
	all := pdsBytes(t, env.PDS, env.Account.DID, b.DID())
	if !bytes.Contains(all, []byte("with a secret")) {
		t.Fatal("the infra record is not in the scanned bytes")
	}
	if bytes.Contains(all, []byte(value)) || bytes.Contains(all, []byte(base64.StdEncoding.EncodeToString([]byte(value)))) {
		t.Fatal("the secret value in a record or frame")
	}
	if err := env.Client.Delete(ctx, inf); err != nil {
		t.Fatal(err)
	}
	waitNoProcs(t, b.stateDir)
	if strings.Contains(logs.String(), value) {
		t.Fatal("the secret value in a log line")
	}
}
