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
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// bidderProc is a `socialweb bidder` process that the test kills and starts again.
type bidderProc struct {
	t                     *testing.T
	args                  []string
	cmd                   *exec.Cmd
	out                   *testenv.LogBuffer
	state, listen, handle string
}

func (p *bidderProc) start() {
	p.t.Helper()
	p.cmd = exec.Command(socialwebBin, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
}

// kill ends the process with SIGKILL: nothing of it runs after, as in a crash.
func (p *bidderProc) kill() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}

// freeLoopbackAddr is a 127.0.0.1 address with a port free at the time of the call.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// deliverOnce posts one deliverSecrets call; a refused connection (the endpoint not yet
// listening) is status 0.
func deliverOnce(endpoint, token string, in mk.DeliverSecretsInput) (int, string) {
	body, _ := json.Marshal(in)
	req, _ := http.NewRequest(http.MethodPost, endpoint+"/xrpc/"+mk.DeliverSecretsNSID, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var xe struct{ Error string }
	_ = json.Unmarshal(raw, &xe)
	return resp.StatusCode, xe.Error
}

// A bidder killed (SIGKILL) and started again over the same state dir keeps what it knew of
// secrets: killed while it waited for a contract's secrets, the restarted bidder still takes
// them and boots the guest; killed while the guest runs, the restarted bidder finds the guest
// with its secrets, answers the requester's repeated delivery 200 without a second boot, and
// still refuses another DID. What it remembers is in its state dir (0600), names no value,
// and goes with the contract.
func TestACC_MarketBidderKilledKeepsSecrets(t *testing.T) {
	env := testenv.Start(t, testenv.Options{PDS: true})
	ctx := context.Background()
	const handle = "killsec.test"
	if _, err := env.PDS.CreateAccount(ctx, handle, "pw-"+handle); err != nil {
		t.Fatal(err)
	}
	if _, err := env.PDS.CreateAccount(ctx, "mallory.test", "pw-mallory"); err != nil {
		t.Fatal(err)
	}
	bidderDID, _, err := env.PDS.Account(ctx, handle)
	if err != nil {
		t.Fatal(err)
	}
	mallory, _, err := env.PDS.Account(ctx, "mallory.test")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte("pw-"+handle+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state, listen := filepath.Join(dir, "state"), freeLoopbackAddr(t)
	guests := filepath.Join(state, "guests")
	sub, err := deno.New(deno.Config{StateDir: guests})
	if err != nil || sub.Binary() == "" {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	p := &bidderProc{t: t, out: &testenv.LogBuffer{}, state: state, listen: listen, handle: handle,
		args: []string{"bidder", "--pds", env.PDS.URL(), "--identifier", handle, "--password-file", pwFile, "--state-dir", state,
			"--cost", "2", "--log-level", "debug", "--plc-url", env.PDS.PLCURL(), "--listen", listen}}
	p.start()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		_ = p.cmd.Wait()
		if pids := substratetest.Procs(guests); len(pids) != 0 {
			t.Errorf("guest processes left: %v", pids)
		}
	})
	substratetest.Cleanup(t, sub, guests)
	endpoint := "http://" + listen
	owner := env.Account.DID
	tok := func(did string) string {
		t.Helper()
		s, err := env.PDS.ServiceAuth(ctx, did, bidderDID, mk.DeliverSecretsNSID, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	value := fmt.Sprintf("kept-%d", time.Now().UnixNano())
	b64 := base64.StdEncoding.EncodeToString([]byte(value))

	// Accepted and receipted: the winner waits for the secrets. It is killed then.
	m := requestByHandFrom(t, env, bidderDID, []string{"token"})
	p.kill()
	p.start()
	in := mk.DeliverSecretsInput{Accept: m.accept, Secrets: []mk.DeliverSecretsSecret{{Name: "token", Value: b64}}}
	testenv.Eventually(t, 20*time.Second, "the restarted bidder takes the secrets", func() (bool, error) {
		status, xerr := deliverOnce(endpoint, tok(owner), in)
		if status != 0 && status != 200 {
			t.Fatalf("delivery to the restarted bidder: %d %s\n%s", status, xerr, p.out.String())
		}
		return status == 200, fmt.Errorf("%d %s", status, xerr)
	})
	sum := sha256.Sum256([]byte(value))
	want := fmt.Sprintf("secret sha256 %s len %d", hex.EncodeToString(sum[:]), len(value))
	id := bidder.GuestID(m.accept)
	testenv.Eventually(t, 20*time.Second, "the guest prints the secret's hash", func() (bool, error) {
		l, _ := sub.Logs(ctx, id, 0)
		return strings.Contains(string(l), want), fmt.Errorf("guest log %q", l)
	})
	gs, err := sub.Status(ctx, id)
	if err != nil || gs.Phase != substrate.Running {
		t.Fatalf("guest %+v %v", gs, err)
	}
	pid := gs.PID

	// Killed while the guest runs; what it remembers is in the state dir and holds no value.
	p.kill()
	file := filepath.Join(state, "secrets-delivered.json")
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatalf("the bidder's state: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s mode %v, want 0600", file, fi.Mode().Perm())
	}
	raw, _ := os.ReadFile(file)
	if !strings.Contains(string(raw), m.accept) || !strings.Contains(string(raw), owner) {
		t.Fatalf("%s does not name the accept and its requester: %s", file, raw)
	}
	if strings.Contains(string(raw), value) || strings.Contains(string(raw), b64) {
		t.Fatalf("%s holds the secret value", file)
	}
	p.start()
	// The requester repeats its delivery (its answer may have been lost): taken, nothing
	// changes, not the guest nor its secret; another DID is still refused.
	poison := mk.DeliverSecretsInput{Accept: m.accept, Secrets: []mk.DeliverSecretsSecret{{Name: "token", Value: base64.StdEncoding.EncodeToString([]byte("poison"))}}}
	testenv.Eventually(t, 20*time.Second, "the repeated delivery answered", func() (bool, error) {
		status, xerr := deliverOnce(endpoint, tok(owner), poison)
		if status != 0 && status != 200 {
			t.Fatalf("a repeated delivery after the restart: %d %s, want 200", status, xerr)
		}
		return status == 200, fmt.Errorf("%d %s", status, xerr)
	})
	if status, xerr := deliverOnce(endpoint, tok(mallory), poison); status != 403 || xerr != "NotRequester" {
		t.Fatalf("another DID after the restart: %d %s, want 403 NotRequester", status, xerr)
	}
	gs, err = sub.Status(ctx, id)
	if err != nil || gs.Phase != substrate.Running || gs.PID != pid {
		t.Fatalf("guest after the restart %+v %v, want the same process %d running", gs, err, pid)
	}
	secret, err := os.ReadFile(filepath.Join(guests, id, "secrets", "token"))
	if err != nil || string(secret) != value {
		t.Fatalf("the guest's secret after the restart: %v (equal: %v)", err, string(secret) == value)
	}

	m.release(t)
	waitNoProcs(t, guests)
	testenv.Eventually(t, 10*time.Second, "the accept gone from the state", func() (bool, error) {
		raw, err := os.ReadFile(file)
		return err == nil && !strings.Contains(string(raw), m.accept), fmt.Errorf("%s: %s %v", file, raw, err)
	})
	if strings.Contains(p.out.String(), value) || strings.Contains(p.out.String(), b64) {
		t.Fatal("the secret value in the bidder's log")
	}
	if !strings.Contains(p.out.String(), "market_secrets_awaited_again") {
		t.Fatalf("the bidder's log does not show the wait taken up again:\n%s", p.out.String())
	}
}
