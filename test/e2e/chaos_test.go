package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/app"
	"socialweb.computer/internal/atclient"
	atinfra "socialweb.computer/internal/atproto/infra"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/crashpoint"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// chaosRow is one crash point of the chaos suite: deploy or release an Infra with `up` set to
// die there.
type chaosRow struct {
	point string
	// release: the point is on the release path (the Infra is deployed first, then deleted).
	release bool
	// down is how long up stays down after the crash before it is started again: past the
	// bid window, nothing bid on the rfp (up's bidder died with it).
	down time.Duration
}

// name is the row's subtest name.
func (r chaosRow) name() string {
	if r.down > 0 {
		return r.point + "+down" + r.down.String()
	}
	return r.point
}

// chaosRows are every crash point `up` passes through when an Infra is deployed and deleted:
// its requester's, its record writer's, its Infra controller's and its local bidder's.
var chaosRows = []chaosRow{
	{point: crashpoint.BidderBeforeBid},
	{point: crashpoint.InfraAfterChildApply},
	{point: crashpoint.RecordAfterRead},
	{point: crashpoint.RecordAfterWrite},
	{point: crashpoint.InfraAfterContractCreate},
	{point: crashpoint.RequesterAfterRFP},
	// up down past the window of an rfp no bid was written for (up's bidder died with it).
	{point: crashpoint.BidderBeforeBid, down: 6 * time.Second}, // chaosInfra's window is 5 s
	{point: crashpoint.RequesterAfterAccept},
	{point: crashpoint.BidderAfterIntent},
	{point: crashpoint.DenoAfterStateDir},
	{point: crashpoint.GuestAfterSpawn},
	{point: crashpoint.BidderAfterBoot},
	{point: crashpoint.BidderAfterReceipt},
	{point: crashpoint.BidderBeforeStarted},
	{point: crashpoint.InfraAfterRelease, release: true},
	{point: crashpoint.RequesterAfterDelete, release: true},
}

// Every crash point of crashpoint.Names has a row: a point added without one fails here.
func TestChaos_EveryPointHasARow(t *testing.T) {
	have := map[string]bool{}
	for _, r := range chaosRows {
		have[r.point] = true
	}
	for _, n := range crashpoint.Names {
		if !have[n] {
			t.Errorf("crash point %s has no row in chaosRows", n)
		}
	}
}

// TestChaos_CrashAtEveryPoint: `socialweb up` built with crash points is killed (exit 137,
// nothing run after) at each named point while an Infra with one deno contract is deployed,
// or, for the release-path points, while it is deleted; `up` started again on the same data
// dir must finish the job: Deployed once (one accept, one receipt, one running guest, one
// record, which says deployed with the winner), and for a release the Infra gone, its record
// ended with endReason deleted; no guest process left after the release; the contract never
// shown Released or Failed before its release was asked.
func TestChaos_CrashAtEveryPoint(t *testing.T) {
	t.Parallel()
	bin := crashpointBinary(t)
	if deno.DefaultBinary() == "" {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	dir := filepath.Join(t.TempDir(), "data")
	for i, row := range chaosRows {
		t.Run(row.name(), func(t *testing.T) { crashRow(t, bin, dir, fmt.Sprintf("chaos%d", i), row) })
	}
}

// withBinary runs up from bin with env added.
func withBinary(bin string, env ...string) func(*exec.Cmd) {
	return func(cmd *exec.Cmd) {
		cmd.Path = bin
		cmd.Args[0] = bin
		cmd.Env = append(os.Environ(), env...)
	}
}

// chaosInfra is the Infra a chaos row deploys: one deno contract, Requested, bound to the
// repo owner.
func chaosInfra(name string) *v1alpha1.Infra {
	return &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1alpha1.InfraSpec{Description: "chaos " + name,
			Record: &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "owner"}},
			Contracts: []v1alpha1.InfraContract{{Name: "api", State: v1alpha1.ContractRequested, ComputeKind: v1alpha1.ComputeKindDeno,
				UserData:   `setInterval(() => {}, 1000);`,
				PolicyArgs: map[string]string{"bidWindowSec": "5", "answerTimeoutSec": "20"}}}}}
}

// ensureOwnerRepo creates the AtprotoRepo owner (up's own account) once per data dir.
func ensureOwnerRepo(t *testing.T, c client.Client) {
	t.Helper()
	repo := &v1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "owner"},
		Spec: v1alpha1.AtprotoRepoSpec{Local: &v1alpha1.LocalRepoSource{Account: app.DefaultHandle}}}
	if err := c.Create(context.Background(), repo); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// waitCrash waits for up to exit 137 at point.
func waitCrash(t *testing.T, up *upProc, point string) {
	t.Helper()
	select {
	case err := <-up.done:
		var ee *exec.ExitError
		up.mu.Lock()
		said := strings.Contains(strings.Join(up.phases, "\n"), "crashpoint "+point)
		up.mu.Unlock()
		if !errors.As(err, &ee) || ee.ExitCode() != 137 || !said {
			t.Fatalf("up ended %v, want exit 137 at %s", err, point)
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("up did not reach %s", point)
	}
}

// phaseLog records every phase a ComputeContract shows, across restarts of up (the
// kubeconfig is read again after any error: the port changes).
type phaseLog struct {
	mu     sync.Mutex
	phases []v1alpha1.ComputeContractPhase
	stop   context.CancelFunc
	done   chan struct{}
}

func watchPhases(dir, name string) *phaseLog {
	ctx, cancel := context.WithCancel(context.Background())
	l := &phaseLog{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		var c client.Client
		for ctx.Err() == nil {
			if c == nil {
				if cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig")); err == nil {
					c, _ = client.New(cfg, client.Options{Scheme: manager.Scheme()})
				}
			}
			var cc v1alpha1.ComputeContract
			if c != nil {
				if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &cc); err == nil {
					l.mu.Lock()
					if n := len(l.phases); cc.Status.Phase != "" && (n == 0 || l.phases[n-1] != cc.Status.Phase) {
						l.phases = append(l.phases, cc.Status.Phase)
					}
					l.mu.Unlock()
				} else if !apierrors.IsNotFound(err) {
					c = nil
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return l
}

func (l *phaseLog) seen() []v1alpha1.ComputeContractPhase {
	l.stop()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]v1alpha1.ComputeContractPhase(nil), l.phases...)
}

func crashRow(t *testing.T, bin, dir, name string, row chaosRow) {
	ctx := context.Background()
	guests := filepath.Join(dir, "bidder", "guests")
	ccName := infra.ContractName(infra.KindInfra, name, "api")

	up := startUpWith(t, dir, withBinary(bin, crashpoint.Env+"="+row.point))
	pdsURL := up.phase(t, "PDS serving at ")
	bidderDID := up.phase(t, "local bidder "+app.LocalBidderHandle)
	c := coreClient(t, dir)
	ensureOwnerRepo(t, c)
	phases := watchPhases(dir, ccName)
	if err := c.Create(ctx, chaosInfra(name)); err != nil {
		t.Fatal(err)
	}
	var deployed *v1alpha1.Infra
	if row.release {
		deployed = waitDeployed(t, c, name)
		if err := c.Delete(ctx, chaosInfra(name)); err != nil {
			t.Fatal(err)
		}
	}
	waitCrash(t, up, row.point)
	time.Sleep(row.down)

	up = startUpWith(t, dir, withBinary(bin))
	c = coreClient(t, dir)
	pc := atclient.New(pdsURL)
	if pdsURL != up.phase(t, "PDS serving at ") {
		pc = atclient.New(up.phase(t, "PDS serving at "))
	}
	if !row.release {
		deployed = waitDeployed(t, c, name)
	}
	var cc v1alpha1.ComputeContract
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: ccName}, &cc); err != nil && !row.release {
		t.Fatal(err)
	}
	owner, recURI := deployed.Status.Record, ""
	if owner != nil {
		recURI = owner.URI
	}
	if !row.release {
		assertDeployedOnce(t, pc, deployed, &cc, bidderDID, guests)
		if seen := phases.seen(); containsEnd(seen) {
			t.Fatalf("contract phases %v: shown ended before any release was asked", seen)
		}
		if err := c.Delete(ctx, chaosInfra(name)); err != nil {
			t.Fatal(err)
		}
	} else {
		phases.seen()
	}
	testenv.Eventually(t, 60*time.Second, "Infra "+name+" and its contract gone", func() (bool, error) {
		errI := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &v1alpha1.Infra{})
		errC := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: ccName}, &v1alpha1.ComputeContract{})
		return apierrors.IsNotFound(errI) && apierrors.IsNotFound(errC), fmt.Errorf("infra: %v, contract: %v", errI, errC)
	})
	waitNoProcs(t, guests)
	// The record ends as the object did: deleted.
	u, err := infra.ParseATURI(recURI)
	if err != nil {
		t.Fatalf("record URI %q of the deployed Infra: %v", recURI, err)
	}
	rec, err := pc.GetRecord(ctx, u.DID.String(), u.Collection.String(), u.Rkey.String())
	if err != nil {
		t.Fatal(err)
	}
	var ir atinfra.Infra
	if err := json.Unmarshal(rec.Value, &ir); err != nil {
		t.Fatal(err)
	}
	if ir.Status == nil || deref(ir.Status.EndReason) != atinfra.InfraStatusEndReasonDeleted {
		t.Fatalf("record %s after the Infra is gone: status %s, want endReason deleted", recURI, statusJSON(ir.Status))
	}
	up.stop(t)
}

// containsEnd reports whether a contract was shown Released or Failed.
func containsEnd(phases []v1alpha1.ComputeContractPhase) bool {
	for _, p := range phases {
		if p == v1alpha1.ComputeContractReleased || p == v1alpha1.ComputeContractFailed {
			return true
		}
	}
	return false
}

// waitDeployed waits until the Infra is Deployed, in sync with its record, and returns it.
func waitDeployed(t *testing.T, c client.Client, name string) *v1alpha1.Infra {
	t.Helper()
	var inf v1alpha1.Infra
	testenv.Eventually(t, 90*time.Second, "Infra "+name+" Deployed and in sync", func() (bool, error) {
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &inf); err != nil {
			return false, err
		}
		synced := condIs(&inf, v1alpha1.ConditionSynced, metav1.ConditionTrue, "") && inf.Status.Record != nil &&
			inf.Status.Record.URI != "" && inf.Status.Record.SyncedGeneration == inf.Generation
		ok := inf.Status.Phase == v1alpha1.InfraDeployed && inf.Status.ContractsReady == "1/1" && synced
		return ok, fmt.Errorf("status %s", statusJSON(inf.Status))
	})
	return &inf
}

// assertDeployedOnce checks what a deployment left in the records and on the host: one
// accept of the contract's rfp in the owner's repo, one receipt of that accept in the
// bidder's, one running guest (the accept's) and no other, one record of the Infra in its
// repo, saying deployed with the winner.
func assertDeployedOnce(t *testing.T, pc *atclient.Client, inf *v1alpha1.Infra, cc *v1alpha1.ComputeContract, bidderDID, guests string) {
	t.Helper()
	ctx := context.Background()
	if cc.Status.Phase != v1alpha1.ComputeContractHeld || cc.Status.Winner != bidderDID {
		t.Fatalf("contract %s: phase %s winner %s, want Held by %s", cc.Name, cc.Status.Phase, cc.Status.Winner, bidderDID)
	}
	u, err := infra.ParseATURI(inf.Status.Record.URI)
	if err != nil {
		t.Fatal(err)
	}
	owner := u.DID.String()
	list := func(did, coll string) []atclient.Record {
		t.Helper()
		var all []atclient.Record
		cursor := ""
		for {
			recs, next, err := pc.ListRecords(ctx, did, coll, 100, cursor, false)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, recs...)
			if next == "" || len(recs) == 0 {
				return all
			}
			cursor = next
		}
	}
	accepts := 0
	for _, r := range list(owner, mk.AcceptNSID) {
		var a mk.Accept
		if json.Unmarshal(r.Value, &a) == nil && a.RFP.URI == cc.Status.RFP {
			accepts++
		}
	}
	receipts := 0
	for _, r := range list(bidderDID, mk.ReceiptNSID) {
		var rc mk.Receipt
		if json.Unmarshal(r.Value, &rc) == nil && rc.Accept.URI == cc.Status.Accept {
			receipts++
		}
	}
	if accepts != 1 || receipts != 1 {
		t.Fatalf("%d accepts of %s and %d receipts of %s, want 1 and 1", accepts, cc.Status.RFP, receipts, cc.Status.Accept)
	}
	// One guest dir, the accept's, with a live process.
	ents, err := os.ReadDir(guests)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	want := bidder.GuestID(cc.Status.Accept)
	if len(ids) != 1 || ids[0] != want {
		t.Fatalf("guest dirs %v, want only %s", ids, want)
	}
	if len(substratetest.Procs(filepath.Join(guests, want))) == 0 {
		t.Fatalf("guest %s has no process", want)
	}
	// And one guest: one supervisor of that dir. A boot cut short after its supervisor was
	// spawned leaves one that no pid.json names; it must be found and ended, not run beside
	// the guest booted again.
	if sups := supervisorsOf(filepath.Join(guests, want)); len(sups) != 1 {
		t.Fatalf("guest %s has %d supervisor processes %v, want 1", want, len(sups), sups)
	}
	// One record of the deployment, in step with the object.
	n := 0
	for _, r := range list(owner, infraNSID) {
		ru, err := infra.ParseATURI(r.URI)
		if err == nil && infra.InSuccession(inf.Name, string(inf.UID), ru.Rkey.String()) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d records of Infra %s in %s, want 1", n, inf.Name, infraNSID)
	}
	testenv.Eventually(t, 30*time.Second, "the record says deployed with the winner", func() (bool, error) {
		rec, err := pc.GetRecord(ctx, owner, u.Collection.String(), u.Rkey.String())
		if err != nil {
			return false, err
		}
		var ir atinfra.Infra
		if err := json.Unmarshal(rec.Value, &ir); err != nil {
			return false, err
		}
		rc := recordContract(&ir, "api")
		return ir.Status != nil && deref(ir.Status.Phase) == "deployed" && rc != nil && deref(rc.Phase) == "deployed" && deref(rc.Winner) == bidderDID &&
			len(ir.Contracts) == 1 && ir.Contracts[0].State == "requested", fmt.Errorf("record %s", statusJSON(ir))
	})
}

// supervisorsOf lists the guest supervisors of dir: the processes whose command line is
// guestproc's supervisor script (/bin/sh -c SCRIPT socialweb-guest DIR ...) run for dir.
func supervisorsOf(dir string) []int {
	var pids []int
	for _, pid := range substratetest.Procs(dir) {
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if len(args) > 4 && args[0] == "/bin/sh" && args[3] == "socialweb-guest" && args[4] == dir {
			pids = append(pids, pid)
		}
	}
	return pids
}
