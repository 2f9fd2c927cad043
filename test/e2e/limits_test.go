package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/core"
	"socialweb.computer/internal/testenv"
)

// rawPost sends body to path on the core's API server as the admin and returns the status
// code and, for a refusal, the decoded Status (failing when it is not one).
func rawPost(t *testing.T, cfg *rest.Config, path, contentType string, body []byte) (int, metav1.Status) {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, cfg.Host+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST %s: no answer: %v", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode < 300 {
		return resp.StatusCode, metav1.Status{}
	}
	var st metav1.Status
	if err := json.Unmarshal(raw, &st); err != nil || st.Kind != "Status" {
		t.Fatalf("POST %s: %d %.300q is not a Status", path, resp.StatusCode, raw)
	}
	return resp.StatusCode, st
}

const infrasPath = "/apis/socialweb.computer/v1alpha1/namespaces/default/infras"

// recordsPath takes AtprotoRecords, whose spec.record is free-form: the kind of ours that
// can be made as large as a body may be.
const recordsPath = "/apis/socialweb.computer/v1alpha1/namespaces/default/atprotorecords"

// bigRecord is an AtprotoRecord named name whose record holds value.
func bigRecord(name, value string) string {
	return `{"apiVersion":"socialweb.computer/v1alpha1","kind":"AtprotoRecord","metadata":{"name":"` + name +
		`"},"spec":{"repoRef":{"name":"owner"},"collection":"computer.socialweb.test","rkey":"` + name + `","record":{"a":"` + value + `"}}}`
}

// A create over the body limit is refused by the API server with 413 and the limit, before
// etcd is asked (which answered a raw gRPC ResourceExhausted).
func TestCore_OversizedCreateIsRequestEntityTooLarge(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	big := bigRecord("big", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x5a}, 3<<19))) // 2 MiB of JSON
	code, st := rawPost(t, env.Config, recordsPath, "application/json", []byte(big))
	if code != http.StatusRequestEntityTooLarge || st.Reason != metav1.StatusReasonRequestEntityTooLarge {
		t.Fatalf("2 MiB create: %d %s %q, want 413 RequestEntityTooLarge", code, st.Reason, st.Message)
	}
	if !strings.Contains(st.Message, fmt.Sprint(core.MaxRequestBodyBytes)) {
		t.Errorf("message %q does not say the limit %d", st.Message, core.MaxRequestBodyBytes)
	}
	// A body just under the limit is stored, although what storage adds (uid, timestamps,
	// managed fields, the encryption's envelope) takes it past etcd's default 1.5 MiB.
	n := (core.MaxRequestBodyBytes - len(bigRecord("fits", "")) - 16) / 4 * 3
	fits := bigRecord("fits", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x5a}, n)))
	if code, st := rawPost(t, env.Config, recordsPath, "application/json", []byte(fits)); code != http.StatusCreated {
		t.Fatalf("create of %d bytes: %d %s %q", len(fits), code, st.Reason, st.Message)
	}
}

// A protobuf body to a custom resource is answered 415 with a Status, as an unsupported media
// type is upstream, instead of panicking the handler and dropping the connection.
func TestCore_ProtobufBodyToCustomResourceIsUnsupported(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	garbage := append([]byte("k8s\x00"), bytes.Repeat([]byte{0xff, 0x01, 0x7f}, 64)...)
	for _, body := range [][]byte{garbage, []byte("not protobuf at all")} {
		code, st := rawPost(t, env.Config, infrasPath, "application/vnd.kubernetes.protobuf", body)
		if code != http.StatusUnsupportedMediaType || st.Reason != metav1.StatusReasonUnsupportedMediaType {
			t.Fatalf("protobuf create: %d %s %q, want 415 UnsupportedMediaType", code, st.Reason, st.Message)
		}
		if !strings.Contains(st.Message, "application/json") {
			t.Errorf("message %q does not say what to send", st.Message)
		}
	}
	// The server still serves.
	if err := env.Client.Create(context.Background(), &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: "after", Namespace: "default"}}); err != nil {
		t.Fatalf("create after: %v", err)
	}
}

// A userData past the records' 64 KiB is refused at apply, naming the field, instead of
// being admitted and stuck at the record write.
func TestInfra_OversizedUserDataIsRefusedAtApply(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	ctx := context.Background()
	for i, ud := range []string{strings.Repeat("a", 921602), strings.Repeat("é", 40000)} {
		inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("big-%d", i), Namespace: "default"},
			Spec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{{Name: "web", State: v1alpha1.ContractRequested, ComputeKind: v1alpha1.ComputeKindDeno, UserData: ud}}}}
		err := env.Client.Create(ctx, inf)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.contracts[0].userData") {
			t.Errorf("Infra with %d bytes of userData: %v, want Invalid naming spec.contracts[0].userData", len(ud), err)
		}
		cc := &v1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("big-%d", i), Namespace: "default"},
			Spec: v1alpha1.ComputeContractSpec{ComputeKind: v1alpha1.ComputeKindDeno, UserData: ud}}
		err = env.Client.Create(ctx, cc)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.userData") {
			t.Errorf("ComputeContract with %d bytes of userData: %v, want Invalid naming spec.userData", len(ud), err)
		}
	}
	ok := &v1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: "fits", Namespace: "default"},
		Spec: v1alpha1.ComputeContractSpec{ComputeKind: v1alpha1.ComputeKindDeno, UserData: strings.Repeat("a", 65536)}}
	if err := env.Client.Create(ctx, ok); err != nil {
		t.Fatalf("64 KiB of userData refused: %v", err)
	}
}

// A contract the API admits but no record can be written for (here a Secret of 65 keys: the
// compute.vm payload names at most 64, and a Secret's keys are no field of the contract) says
// so on the contract, naming the field: Pending, Ready False InvalidPayload, no rfp.
func TestMarket_RefusedRecordIsAConditionOnTheContract(t *testing.T) {
	env := testenv.Start(t, testenv.Options{PDS: true})
	env.StartControllers(t, slog.New(slog.NewTextHandler(io.Discard, nil)))
	localRepo(t, env, "owner")
	data := map[string][]byte{}
	for i := range 65 {
		data[fmt.Sprintf("k%02d", i)] = []byte("v")
	}
	newSecret(t, env, "many", data)
	newContract(t, env, "many", func(c *v1alpha1.ComputeContract) { c.Spec.SecretsRef = &v1alpha1.SecretKeyRef{Name: "many"} })
	testenv.Eventually(t, 30*time.Second, "Ready InvalidPayload", func() (bool, error) {
		var c v1alpha1.ComputeContract
		if err := env.Client.Get(context.Background(), key("many"), &c); err != nil {
			return false, err
		}
		cond := meta.FindStatusCondition(c.Status.Conditions, string(v1alpha1.ConditionReady))
		if cond == nil {
			return false, fmt.Errorf("phase %q, no Ready condition", c.Status.Phase)
		}
		ok := c.Status.Phase == v1alpha1.ComputeContractPending && cond.Status == metav1.ConditionFalse &&
			cond.Reason == "InvalidPayload" && strings.Contains(cond.Message, "secrets") && c.Status.RFP == ""
		return ok, fmt.Errorf("phase %q, Ready %s %s %q", c.Status.Phase, cond.Status, cond.Reason, cond.Message)
	})

	// Declared in an Infra, the deployment's Ready condition says the same, naming the contract.
	inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: "many", Namespace: ns}, Spec: v1alpha1.InfraSpec{
		Record:    &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "owner"}},
		Contracts: []v1alpha1.InfraContract{{Name: "web", State: v1alpha1.ContractRequested, ComputeKind: v1alpha1.ComputeKindDeno, UserData: foreverGuest}},
		Secrets:   []v1alpha1.InfraContractSecret{{Contract: "web", SecretRef: v1alpha1.SecretKeyRef{Name: "many"}}},
	}}
	if err := env.Client.Create(context.Background(), inf); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "Infra Ready InvalidPayload", func() (bool, error) {
		var got v1alpha1.Infra
		if err := env.Client.Get(context.Background(), key("many"), &got); err != nil {
			return false, err
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionReady))
		if cond == nil {
			return false, fmt.Errorf("phase %q, no Ready condition", got.Status.Phase)
		}
		ok := cond.Status == metav1.ConditionFalse && cond.Reason == "InvalidPayload" && strings.Contains(cond.Message, "contract web") &&
			strings.Contains(cond.Message, "secrets")
		return ok, fmt.Errorf("phase %q, Ready %s %s %q", got.Status.Phase, cond.Status, cond.Reason, cond.Message)
	})
}

// An object grown past what etcd holds by a patch within the body limit is answered 413
// with the limit too, not a raw gRPC error.
func TestCore_ObjectGrownPastStorageIsRequestEntityTooLarge(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	const path = recordsPath
	value := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x5a}, 1<<20)) // 1.33 MiB of JSON
	if code, st := rawPost(t, env.Config, path, "application/json", []byte(bigRecord("grows", value))); code != http.StatusCreated {
		t.Fatalf("create: %d %s %q", code, st.Reason, st.Message)
	}
	hc, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPatch, env.Config.Host+path+"/grows", strings.NewReader(`{"spec":{"record":{"b":"`+value+`"}}}`))
	req.Header.Set("Content-Type", "application/merge-patch+json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st metav1.Status
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &st)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || st.Reason != metav1.StatusReasonRequestEntityTooLarge || !strings.Contains(st.Message, "2097152") {
		t.Fatalf("patch past 2 MiB: %d %s %.300q, want 413 naming the limit", resp.StatusCode, st.Reason, st.Message)
	}
}
