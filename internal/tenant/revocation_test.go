package tenant

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// auditLine is one audit event as the apiserver writes it (JSON, one a line).
func auditLine(user, impersonated, credential, resource, sub, ns, name, uid, issued string, code int) string {
	var b strings.Builder
	b.WriteString(`{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","verb":"create",`)
	b.WriteString(`"user":{"username":"` + user + `"`)
	if credential != "" {
		b.WriteString(`,"extra":{"authentication.kubernetes.io/credential-id":["` + credential + `"]}`)
	}
	b.WriteString(`}`)
	if impersonated != "" {
		b.WriteString(`,"impersonatedUser":{"username":"` + impersonated + `"}`)
	}
	b.WriteString(`,"objectRef":{"resource":"` + resource + `","namespace":"` + ns + `","name":"` + name + `"`)
	if sub != "" {
		b.WriteString(`,"subresource":"` + sub + `"`)
	}
	b.WriteString(`},"responseStatus":{"code":`)
	b.WriteString(strconv.Itoa(code) + `}`)
	if uid != "" {
		b.WriteString(`,"responseObject":{"metadata":{"name":"` + name + `","namespace":"` + ns + `","uid":"` + uid + `"}}`)
	}
	if issued != "" {
		b.WriteString(`,"annotations":{"authentication.kubernetes.io/issued-credential-id":"` + issued + `"}`)
	}
	b.WriteString("}\n")
	return b.String()
}

// What an identity made is found in the audit log, transitively, whatever the order, and
// nothing of anyone else's: the table's log mixes the revoked DID's requests with another
// member's, the controller's, a refused request and a cut line.
func TestAttribute(t *testing.T) {
	const did, other = "did:plc:revoked", "did:plc:other"
	ownerSA := serviceAccountUser(OwnerNamespace, OwnerServiceAccount(did))
	log := strings.Join([]string{
		// The ServiceAccount the DID makes below makes one more, logged first: the order
		// of the log does not matter.
		auditLine("system:serviceaccount:default:mine", "", "", "serviceaccounts", "", "default", "grandchild", "uid-gc", "", 201),
		// The DID makes a ServiceAccount and binds it to cluster-admin.
		auditLine(did, "", "X509SHA256=aa", "serviceaccounts", "", "default", "mine", "uid-mine", "", 201),
		auditLine(did, "", "", "clusterrolebindings", "", "", "mine-admin", "uid-crb", "", 201),
		// A token of it, and a token of an existing ServiceAccount.
		auditLine(did, "", "", "serviceaccounts", "token", "default", "mine", "", "JTI=t-mine", 201),
		auditLine(did, "", "", "serviceaccounts", "token", "kube-system", "deployer", "", "JTI=t-deployer", 201),
		// With the deployer token, another token and a RoleBinding: the chain is the DID's.
		auditLine("system:serviceaccount:kube-system:deployer", "", "JTI=t-deployer", "serviceaccounts", "token", "kube-system", "ci", "", "JTI=t-chained", 201),
		auditLine("system:serviceaccount:kube-system:deployer", "", "JTI=t-deployer", "rolebindings", "", "kube-system", "chained", "uid-rb", "", 201),
		// Through the gateway: the controller impersonating the DID's own ServiceAccount.
		auditLine("socialweb:cluster-controller", ownerSA, "", "rolebindings", "", "default", "via-gateway", "uid-gw", "", 201),
		// The deployer token used by someone else (another credential): not the DID's.
		auditLine("system:serviceaccount:kube-system:deployer", "", "JTI=t-node", "serviceaccounts", "token", "kube-system", "x", "", "JTI=t-not", 201),
		// Another member, the controller on its own, and a refused request.
		auditLine(other, "", "", "serviceaccounts", "", "default", "theirs", "uid-theirs", "", 201),
		auditLine("socialweb:cluster-controller", "", "", "clusterrolebindings", "", "", "socialweb:owner", "uid-owner", "", 201),
		auditLine(did, "", "", "clusterrolebindings", "", "", "refused", "", "", 403),
		`{"kind":"Event","stage":"ResponseComplete","verb":"cre`,
	}, "")
	events, err := parseAudit(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	a := Attribute(events, did)
	var objs []string
	for _, o := range a.Objects {
		objs = append(objs, o.String()+"@"+o.UID)
	}
	wantObjs := []string{
		"clusterrolebinding/mine-admin@uid-crb",
		"rolebinding/default/via-gateway@uid-gw",
		"rolebinding/kube-system/chained@uid-rb",
		"serviceaccount/default/grandchild@uid-gc",
		"serviceaccount/default/mine@uid-mine",
	}
	if !slices.Equal(objs, wantObjs) {
		t.Errorf("objects %v, want %v", objs, wantObjs)
	}
	if want := []string{"JTI=t-chained", "JTI=t-deployer", "JTI=t-mine"}; !slices.Equal(a.Credentials, want) {
		t.Errorf("credentials %v, want %v", a.Credentials, want)
	}
	if want := []string{"system:serviceaccount:default:grandchild", "system:serviceaccount:default:mine"}; !slices.Equal(a.ServiceAccounts, want) {
		t.Errorf("service accounts %v, want %v", a.ServiceAccounts, want)
	}
	if b := Attribute(events, other); len(b.Objects) != 1 || b.Objects[0].Name != "theirs" || len(b.Credentials) != 0 {
		t.Errorf("the other member: %+v", b)
	}
	if n := Attribute(events, "did:plc:nobody"); len(n.Objects)+len(n.Credentials) != 0 {
		t.Errorf("an identity that made nothing: %+v", n)
	}
}

func TestTokenPolicyRefuse(t *testing.T) {
	now := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	p := TokenPolicy{
		DeniedCredentials: []string{"JTI=denied"},
		CurrentKeyID:      "k2",
		RetiredKeys:       []RetiredKeyRule{{KeyID: "k1", Until: now.Add(time.Minute)}, {KeyID: "k0", Until: now.Add(-time.Minute)}},
	}
	for _, c := range []struct {
		name   string
		tok    AuthenticatedToken
		policy TokenPolicy
		refuse bool
	}{
		{"current key", AuthenticatedToken{KeyID: "k2", CredentialIDs: []string{"JTI=a"}, ServiceAccount: true}, p, false},
		{"current key, pod-bound", AuthenticatedToken{KeyID: "k2", ServiceAccount: true, PodBound: true}, p, false},
		{"denied credential, current key", AuthenticatedToken{KeyID: "k2", CredentialIDs: []string{"JTI=denied"}, ServiceAccount: true}, p, true},
		{"denied credential, pod-bound", AuthenticatedToken{KeyID: "k1", CredentialIDs: []string{"JTI=denied"}, ServiceAccount: true, PodBound: true}, p, true},
		{"denied credential, not a token", AuthenticatedToken{CredentialIDs: []string{"JTI=denied"}}, p, true},
		{"retired key, not pod-bound", AuthenticatedToken{KeyID: "k1", CredentialIDs: []string{"JTI=b"}, ServiceAccount: true}, p, true},
		{"retired key, pod-bound, in its window", AuthenticatedToken{KeyID: "k1", CredentialIDs: []string{"JTI=c"}, ServiceAccount: true, PodBound: true}, p, false},
		{"retired key, pod-bound, window passed", AuthenticatedToken{KeyID: "k0", ServiceAccount: true, PodBound: true}, p, true},
		{"unknown key", AuthenticatedToken{KeyID: "k9", ServiceAccount: true, PodBound: true}, p, true},
		{"a client certificate", AuthenticatedToken{CredentialIDs: []string{"X509SHA256=ff"}}, p, false},
		{"never rotated: any key", AuthenticatedToken{KeyID: "k1", ServiceAccount: true}, TokenPolicy{DeniedCredentials: []string{"JTI=denied"}}, false},
		{"never rotated: denied", AuthenticatedToken{KeyID: "k1", CredentialIDs: []string{"JTI=denied"}, ServiceAccount: true}, TokenPolicy{DeniedCredentials: []string{"JTI=denied"}}, true},
	} {
		if got, why := c.policy.Refuse(c.tok, now); got != c.refuse {
			t.Errorf("%s: refuse %v (%s), want %v", c.name, got, why, c.refuse)
		}
	}
}

// A rotation keeps the old public key as a retired one for pods' tokens, for
// MaxTokenLifetime; the spec verifies with both and signs with the new one; the policy
// names the current key; a window that has passed leaves the flags and the policy.
func TestRotationAndSpec(t *testing.T) {
	root := t.TempDir()
	l := LayoutFor(root, "ws", "c1")
	p, err := EnsurePKI(l.PKI(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	keyFile, pubFile := serviceAccountKeyFiles(p.Dir)
	kid1, err := KeyIDOfFile(pubFile)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	made := map[string]Attribution{"did:plc:a": {Credentials: []string{"JTI=1", "JTI=2"}}}
	st, err := applyRevocations(l, Revocations{}, []string{"did:plc:a"}, made, now)
	if err != nil {
		t.Fatal(err)
	}
	kid2, err := KeyIDOfFile(pubFile)
	if err != nil || kid2 == kid1 {
		t.Fatalf("after rotation kid %q (before %q): %v", kid2, kid1, err)
	}
	if len(st.RetiredKeys) != 1 || st.RetiredKeys[0].KeyID != kid1 || !st.RetiredKeys[0].PodTokensUntil.Equal(now.Add(MaxTokenLifetime)) {
		t.Errorf("retired keys %+v", st.RetiredKeys)
	}
	if r, _ := KeyIDOfFile(st.RetiredKeys[0].PublicKeyFile); r != kid1 {
		t.Errorf("the retired file holds %q, want %q", r, kid1)
	}
	if !slices.Equal(st.DeniedCredentials, []string{"JTI=1", "JTI=2"}) || !slices.Equal(st.Revoked, []string{"did:plc:a"}) {
		t.Errorf("state %+v", st)
	}
	if u := st.Unapplied([]string{"did:plc:a", "did:plc:b", "did:plc:b"}); !slices.Equal(u, []string{"did:plc:b"}) {
		t.Errorf("unapplied %v", u)
	}

	s := BuildSpec(l, p, 4321, AdvertiseIP, st, kid2, now)
	api := strings.Join(s.APIServer, " ")
	for _, want := range []string{
		"--service-account-signing-key-file=" + keyFile,
		"--service-account-key-file=" + pubFile,
		"--service-account-key-file=" + st.RetiredKeys[0].PublicKeyFile,
		"--service-account-max-token-expiration=1h0m0s",
		"--service-account-extend-token-expiration=false",
		"--audit-policy-file=" + l.AuditPolicy(),
		"--audit-log-path=" + l.AuditLog(),
	} {
		if !strings.Contains(api, want) {
			t.Errorf("apiserver flags lack %s", want)
		}
	}
	if s.TokenPolicy.CurrentKeyID != kid2 || len(s.TokenPolicy.RetiredKeys) != 1 || s.TokenPolicy.RetiredKeys[0].KeyID != kid1 || len(s.TokenPolicy.DeniedCredentials) != 2 {
		t.Errorf("token policy %+v", s.TokenPolicy)
	}
	later := BuildSpec(l, p, 4321, AdvertiseIP, st, kid2, now.Add(MaxTokenLifetime+time.Second))
	if strings.Contains(strings.Join(later.APIServer, " "), st.RetiredKeys[0].PublicKeyFile) || len(later.TokenPolicy.RetiredKeys) != 0 {
		t.Errorf("a retired key past its window is still in the spec: %v %+v", later.APIServer, later.TokenPolicy)
	}
	if never := BuildSpec(l, p, 4321, AdvertiseIP, Revocations{}, kid2, now); never.TokenPolicy.CurrentKeyID != "" {
		t.Errorf("a cluster never rotated has a key rule: %+v", never.TokenPolicy)
	}

	// A crash after the private half was written and before the public one: the next
	// EnsurePKI rewrites sa.pub from sa.key.
	if err := os.WriteFile(pubFile, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsurePKI(l.PKI(), nil, nil); err != nil {
		t.Fatal(err)
	}
	if k, err := KeyIDOfFile(pubFile); err != nil || k != kid2 {
		t.Errorf("sa.pub after repair: %q %v, want %q", k, err, kid2)
	}
}

func TestRequestKeyID(t *testing.T) {
	jwt := func(header string) string {
		return base64.RawURLEncoding.EncodeToString([]byte(header)) + ".e30.sig"
	}
	tok := jwt(`{"alg":"ES256","kid":"abc"}`)
	for _, c := range []struct {
		name string
		h    http.Header
		want string
	}{
		{"bearer", http.Header{"Authorization": {"Bearer " + tok}}, "abc"},
		{"lower-case scheme", http.Header{"Authorization": {"bearer " + tok}}, "abc"},
		{"websocket", http.Header{"Sec-Websocket-Protocol": {"v5.channel.k8s.io, base64url.bearer.authorization.k8s.io." + base64.RawURLEncoding.EncodeToString([]byte(tok))}}, "abc"},
		{"no kid", http.Header{"Authorization": {"Bearer " + jwt(`{"alg":"ES256"}`)}}, ""},
		{"not a JWT", http.Header{"Authorization": {"Bearer opaque"}}, ""},
		{"garbage header", http.Header{"Authorization": {"Bearer !!.e30.sig"}}, ""},
		{"basic", http.Header{"Authorization": {"Basic dXNlcjpwdw=="}}, ""},
		{"none", http.Header{}, ""},
	} {
		if got := RequestKeyID(c.h); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

func TestKeyIDIsStableAndPerKey(t *testing.T) {
	a, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	b, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ka, err := KeyID(&a.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	ka2, _ := KeyID(&a.PublicKey)
	kb, _ := KeyID(&b.PublicKey)
	if ka != ka2 || ka == kb || len(ka) != 43 {
		t.Errorf("kids %q %q %q", ka, ka2, kb)
	}
}

func TestReadAuditLogsReadsRotatedFilesFirst(t *testing.T) {
	l := LayoutFor(t.TempDir(), "ws", "c1")
	if err := os.MkdirAll(l.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(name, line string) {
		if err := os.WriteFile(filepath.Join(l.Dir, name), []byte(line), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("audit-2026-12-01T10-00-00.000.log", auditLine("did:plc:a", "", "", "serviceaccounts", "", "default", "one", "u1", "", 201))
	write("audit-2026-12-02T10-00-00.000.log", auditLine("did:plc:a", "", "", "serviceaccounts", "", "default", "two", "u2", "", 201))
	write("audit.log", auditLine("did:plc:a", "", "", "serviceaccounts", "", "default", "three", "u3", "", 201))
	a, err := AttributionFor(l, "did:plc:a")
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Objects) != 3 {
		t.Errorf("objects %+v, want three, one from each file", a.Objects)
	}
	events, _ := ReadAuditLogs(l)
	if len(events) != 3 || events[0].ObjectRef.Name != "one" || events[2].ObjectRef.Name != "three" {
		t.Errorf("order %+v", events)
	}
}
