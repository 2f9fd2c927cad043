package computecontract

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/substrate"
)

// Condition reasons of SecretsDelivered.
const (
	ReasonSecretUnavailable = "SecretUnavailable"
	ReasonDeliveryFailed    = "DeliveryFailed"
	ReasonDelivered         = "Delivered"
	ReasonAwaitingReceipt   = "AwaitingReceipt"
)

// SecretError is a secretsRef that cannot be delivered as it stands: the Secret or its key
// is missing, or a key cannot name a file in the guest.
type SecretError struct {
	Ref    v1alpha1.SecretKeyRef
	Reason string
}

func (e *SecretError) Error() string {
	return fmt.Sprintf("secretsRef %s: %s", e.Ref.Name, e.Reason)
}

// readSecrets reads the Secret spec.secretsRef names: every key of its data, or only Key
// when set. Values stay in memory: they go to the winner and nowhere else.
func (r *Reconciler) readSecrets(ctx context.Context, obj *v1alpha1.ComputeContract) (map[string][]byte, error) {
	ref := *obj.Spec.SecretsRef
	var sec corev1.Secret
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: obj.Namespace, Name: ref.Name}, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &SecretError{Ref: ref, Reason: fmt.Sprintf("no Secret %s/%s (create it; the contract waits for it)", obj.Namespace, ref.Name)}
		}
		return nil, err
	}
	out := map[string][]byte{}
	if ref.Key != "" {
		v, ok := sec.Data[ref.Key]
		if !ok {
			return nil, &SecretError{Ref: ref, Reason: fmt.Sprintf("Secret %s has no key %q", ref.Name, ref.Key)}
		}
		out[ref.Key] = v
	} else {
		for k, v := range sec.Data {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil, &SecretError{Ref: ref, Reason: fmt.Sprintf("Secret %s has no data", ref.Name)}
	}
	for k := range out {
		if !substrate.ValidSecretName(k) {
			return nil, &SecretError{Ref: ref, Reason: fmt.Sprintf("key %q cannot name a file in the guest: want [A-Za-z0-9][A-Za-z0-9_-]*, at most 63", k)}
		}
	}
	return out, nil
}

func secretNames(vals map[string][]byte) []string {
	names := make([]string, 0, len(vals))
	for k := range vals {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// DeliveryError is a deliverSecrets call the bidder did not take: its XRPC error, or why
// it could not be made.
type DeliveryError struct {
	Bidder, Endpoint string
	Status           int
	Name, Message    string
}

func (e *DeliveryError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("deliverSecrets to %s at %q: %s", e.Bidder, e.Endpoint, e.Message)
	}
	return fmt.Sprintf("deliverSecrets to %s at %s: %d %s: %s", e.Bidder, e.Endpoint, e.Status, e.Name, e.Message)
}

// deliverHTTP is the client of deliverSecrets calls. The secret values are in the request
// body only: never in the URL, a header other than the token, or an error.
var deliverHTTP = &http.Client{Timeout: 10 * time.Second}

// deliverSecrets hands vals to the winner over its offering's endpoint, authenticated with
// a service-auth token of the requester's account (aud the winner, lxm deliverSecrets).
func deliverSecrets(ctx context.Context, repo repos.Repo, endpoint, winner, accept string, vals map[string][]byte) error {
	fail := func(format string, a ...any) error {
		return &DeliveryError{Bidder: winner, Endpoint: endpoint, Message: fmt.Sprintf(format, a...)}
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fail("the winner's offering has no http(s) endpointUrl")
	}
	if u.Scheme == "http" && !market.PlainHTTPAllowed(u.Hostname()) {
		return fail("refusing to send secrets over plain http to a host that is not loopback; the bidder must publish an https endpointUrl")
	}
	sa, ok := repo.(repos.ServiceAuther)
	if !ok {
		return fail("the requester's repo cannot mint service-auth tokens")
	}
	tok, err := sa.ServiceAuth(ctx, winner, mk.DeliverSecretsNSID, time.Minute)
	if err != nil {
		return fail("service auth from %s: %v", repo.DID(), err)
	}
	in := mk.DeliverSecretsInput{Accept: accept}
	for _, name := range secretNames(vals) {
		in.Secrets = append(in.Secrets, mk.DeliverSecretsSecret{Name: name, Value: base64.StdEncoding.EncodeToString(vals[name])})
	}
	body, err := json.Marshal(in)
	if err != nil {
		return fail("encode: %v", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(endpoint, "/")+"/xrpc/"+mk.DeliverSecretsNSID, bytes.NewReader(body))
	if err != nil {
		return fail("request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := deliverHTTP.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fail("%v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusOK {
		var out mk.DeliverSecretsOutput
		if err := json.Unmarshal(raw, &out); err != nil || out.Delivered != int64(len(vals)) {
			return fail("the bidder answered %q, want %d delivered", strings.TrimSpace(string(raw)), len(vals))
		}
		return nil
	}
	var xe struct{ Error, Message string }
	_ = json.Unmarshal(raw, &xe)
	return &DeliveryError{Bidder: winner, Endpoint: endpoint, Status: resp.StatusCode, Name: xe.Error, Message: xe.Message}
}
