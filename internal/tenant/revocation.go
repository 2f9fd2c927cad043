package tenant

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"socialweb.computer/internal/atomicfile"
	"socialweb.computer/internal/certs"
)

// Revoking an identity also ends the service-account tokens it held or minted. Three layers:
//
//  1. Every token the identity requested (TokenRequest, as itself or through anything it
//     made, Attribute) is denied by its credential ID (JTI) at authentication: at once and
//     for every binding (a pod-bound token included).
//  2. The ServiceAccounts it created are deleted (RevokeIdentity): every token of theirs,
//     pods' included, fails the apiserver's lookup of the ServiceAccount.
//  3. The signing key is rotated: tokens signed before the revocation that the identity may
//     have read rather than requested (out of a pod's filesystem, a legacy token Secret) stop
//     verifying, except pod-bound ones, which the kubelet replaces with tokens of the new
//     key at its refresh. Those stay valid while their pod exists and until they expire:
//     the apiserver caps every token at MaxTokenLifetime (--service-account-max-token-
//     expiration), so the retired key verifies nothing after RetiredAt + MaxTokenLifetime.
//     That is the one window left, and only for a pod-bound token copied out of a pod.

// MaxTokenLifetime caps every service-account token a tenant apiserver issues (the lowest
// value kube-apiserver accepts). The kubelet asks for 3607 s by default and refreshes a
// projected token at 80% of the lifetime it was given, so pods hold tokens at most this old
// plus the refresh margin, and a retired key verifies nothing once this has passed.
const MaxTokenLifetime = time.Hour

// RetiredKey is a service-account verification key kept after a rotation, for pods' tokens.
type RetiredKey struct {
	PublicKeyFile string    `json:"publicKeyFile"`
	KeyID         string    `json:"keyID"`
	RetiredAt     time.Time `json:"retiredAt"`
	// PodTokensUntil: until then a pod-bound token signed with this key is accepted
	// (RetiredAt + MaxTokenLifetime: no token it signed lives longer).
	PodTokensUntil time.Time `json:"podTokensUntil"`
}

// Revocations is a cluster's revocation state (revocations.json in its directory): which
// revoked identities were applied, the credentials denied, the keys retired.
type Revocations struct {
	Revoked           []string     `json:"revoked,omitempty"`
	DeniedCredentials []string     `json:"deniedCredentials,omitempty"`
	RetiredKeys       []RetiredKey `json:"retiredKeys,omitempty"`
}

// LoadRevocations reads the cluster's state; none is the zero value.
func LoadRevocations(l Layout) (Revocations, error) {
	var r Revocations
	b, err := os.ReadFile(l.Revocations())
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%s: %w", l.Revocations(), err)
	}
	return r, nil
}

func saveRevocations(l Layout, r Revocations) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(l.Revocations(), b, 0o600)
}

// Unapplied are the DIDs of revoked that the state has not applied yet.
func (r Revocations) Unapplied(revoked []string) []string {
	var out []string
	for _, d := range revoked {
		if !slices.Contains(r.Revoked, d) && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// TokenPolicy is what the tenant apiserver checks after a token verified (ChildSpec): the
// denied credentials, the current signing key and the retired ones.
type TokenPolicy struct {
	DeniedCredentials []string         `json:"deniedCredentials,omitempty"`
	CurrentKeyID      string           `json:"currentKeyID,omitempty"`
	RetiredKeys       []RetiredKeyRule `json:"retiredKeys,omitempty"`
}

// RetiredKeyRule accepts pod-bound tokens of a retired key until Until.
type RetiredKeyRule struct {
	KeyID string    `json:"keyID"`
	Until time.Time `json:"until"`
}

// AuthenticatedToken is what the apiserver established about a request's bearer token.
type AuthenticatedToken struct {
	// KeyID is the kid of the token's (signed) JWS header; empty if it has none or is no JWT.
	KeyID string
	// CredentialIDs are the user's authentication.kubernetes.io/credential-id extra.
	CredentialIDs []string
	// ServiceAccount: the user is a service account authenticated by this bearer token.
	ServiceAccount bool
	// PodBound: the token is bound to a pod (the user has a pod-uid extra).
	PodBound bool
}

// Refuse decides whether an authenticated token must still be refused, and why: a denied
// credential always; a service-account token signed with a key other than the current one
// unless it is pod-bound, signed with a retired key, and that key's window is open.
func (p TokenPolicy) Refuse(t AuthenticatedToken, now time.Time) (bool, string) {
	for _, c := range t.CredentialIDs {
		if slices.Contains(p.DeniedCredentials, c) {
			return true, "the credential " + c + " was revoked"
		}
	}
	if !t.ServiceAccount || p.CurrentKeyID == "" || t.KeyID == p.CurrentKeyID {
		return false, ""
	}
	for _, k := range p.RetiredKeys {
		if k.KeyID != t.KeyID {
			continue
		}
		switch {
		case !t.PodBound:
			return true, "the token was signed with a retired service-account key"
		case now.After(k.Until):
			return true, "the token was signed with a retired service-account key whose window for pods' tokens has passed"
		}
		return false, ""
	}
	return true, "the token was signed with a service-account key this cluster does not sign with"
}

// Policy is the TokenPolicy of this state, with the current key's ID; retired keys whose
// window has passed at now are left out.
func (r Revocations) Policy(currentKeyID string, now time.Time) TokenPolicy {
	p := TokenPolicy{DeniedCredentials: r.DeniedCredentials}
	if len(r.RetiredKeys) == 0 {
		return p
	}
	p.CurrentKeyID = currentKeyID
	for _, k := range r.RetiredKeys {
		if now.Before(k.PodTokensUntil) {
			p.RetiredKeys = append(p.RetiredKeys, RetiredKeyRule{KeyID: k.KeyID, Until: k.PodTokensUntil})
		}
	}
	return p
}

// VerificationKeyFiles are the public keys the apiserver verifies tokens with: the current
// one, then each retired key still in its window.
func (r Revocations) VerificationKeyFiles(current string, now time.Time) []string {
	out := []string{current}
	for _, k := range r.RetiredKeys {
		if now.Before(k.PodTokensUntil) {
			out = append(out, k.PublicKeyFile)
		}
	}
	return out
}

// KeyID is the kid kube-apiserver puts in the tokens it signs with the key whose public half
// is pub: the unpadded base64url SHA-256 of its PKIX DER.
func KeyID(pub any) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(der)
	return base64.RawURLEncoding.EncodeToString(sum[:]), nil
}

// KeyIDOfFile is KeyID of a PEM public key file.
func KeyIDOfFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "", fmt.Errorf("%s: no PEM block", path)
	}
	pub, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return KeyID(pub)
}

// serviceAccountKeyFiles are the current signing pair of a cluster's PKI dir.
func serviceAccountKeyFiles(pkiDir string) (key, pub string) {
	return filepath.Join(pkiDir, "sa.key"), filepath.Join(pkiDir, "sa.pub")
}

// writeServiceAccountKey generates a new ECDSA P-256 signing pair into pkiDir (sa.key,
// sa.pub). ECDSA P-256 (ES256 tokens): an RSA-2048 key took 0.3-1.6 s to generate on a
// loaded 2-core machine, on the path of every new cluster's start.
func writeServiceAccountKey(pkiDir string) error {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return err
	}
	keyPEM, err := certs.KeyPEM(k)
	if err != nil {
		return err
	}
	keyFile, pubFile := serviceAccountKeyFiles(pkiDir)
	// The private half is the truth: a crash before the public half is written leaves a
	// stale sa.pub, which ensureServiceAccountPub rewrites from sa.key at the next start.
	if err := atomicfile.Write(keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	return atomicfile.Write(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

// ensureServiceAccountPub rewrites sa.pub from sa.key when they differ.
func ensureServiceAccountPub(pkiDir string) error {
	keyFile, pubFile := serviceAccountKeyFiles(pkiDir)
	b, err := os.ReadFile(keyFile)
	if err != nil {
		return err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return fmt.Errorf("%s: no PEM block", keyFile)
	}
	k, err := x509.ParseECPrivateKey(blk.Bytes)
	if err != nil {
		return fmt.Errorf("%s: %w", keyFile, err)
	}
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		return err
	}
	want := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	if have, err := os.ReadFile(pubFile); err == nil && string(have) == string(want) {
		return nil
	}
	return atomicfile.Write(pubFile, want, 0o644)
}

// rotateServiceAccountKey keeps the current public key as a retired one
// (sa-retired-<unix nanos>.pub) and writes a new signing pair.
func rotateServiceAccountKey(pkiDir string, now time.Time) (RetiredKey, error) {
	_, pubFile := serviceAccountKeyFiles(pkiDir)
	b, err := os.ReadFile(pubFile)
	if err != nil {
		return RetiredKey{}, err
	}
	kid, err := KeyIDOfFile(pubFile)
	if err != nil {
		return RetiredKey{}, err
	}
	retired := filepath.Join(pkiDir, fmt.Sprintf("sa-retired-%d.pub", now.UnixNano()))
	if err := atomicfile.Write(retired, b, 0o644); err != nil {
		return RetiredKey{}, err
	}
	if err := writeServiceAccountKey(pkiDir); err != nil {
		return RetiredKey{}, err
	}
	return RetiredKey{PublicKeyFile: retired, KeyID: kid, RetiredAt: now, PodTokensUntil: now.Add(MaxTokenLifetime)}, nil
}

// applyRevocations is the state after revoking dids: their attributed credentials denied,
// the signing key rotated. attributions maps each DID to what it made.
func applyRevocations(l Layout, st Revocations, dids []string, attributions map[string]Attribution, now time.Time) (Revocations, error) {
	for _, d := range dids {
		for _, c := range attributions[d].Credentials {
			if !slices.Contains(st.DeniedCredentials, c) {
				st.DeniedCredentials = append(st.DeniedCredentials, c)
			}
		}
	}
	k, err := rotateServiceAccountKey(l.PKI(), now)
	if err != nil {
		return st, fmt.Errorf("rotating the service-account key: %w", err)
	}
	// Keys whose window has passed verify nothing any more: forget them.
	st.RetiredKeys = slices.DeleteFunc(st.RetiredKeys, func(r RetiredKey) bool { return !now.Before(r.PodTokensUntil) })
	st.RetiredKeys = append(st.RetiredKeys, k)
	st.Revoked = append(st.Revoked, dids...)
	slices.Sort(st.Revoked)
	return st, nil
}

// describeAttribution is a log line's summary.
func describeAttribution(a Attribution) string {
	var objs []string
	for _, o := range a.Objects {
		objs = append(objs, o.String())
	}
	return fmt.Sprintf("%d tokens, objects [%s]", len(a.Credentials), strings.Join(objs, " "))
}

// RequestKeyID is the kid of the JWT a request carries as its bearer token (the
// Authorization header, or a WebSocket's base64url.bearer.authorization.k8s.io.
// subprotocol); empty when there is none, it is no JWT or it has no kid. Read before the
// apiserver authenticates the request, since authentication strips the token; trusted only
// once the apiserver has verified the signature, which covers the header.
func RequestKeyID(h http.Header) string {
	tok := ""
	if a := h.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		tok = strings.TrimSpace(a[7:])
	}
	if tok == "" {
		const prefix = "base64url.bearer.authorization.k8s.io."
		for _, v := range h.Values("Sec-WebSocket-Protocol") {
			for _, p := range strings.Split(v, ",") {
				if p = strings.TrimSpace(p); strings.HasPrefix(p, prefix) {
					if b, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(p, prefix)); err == nil {
						tok = string(b)
					}
				}
			}
		}
	}
	head, _, ok := strings.Cut(tok, ".")
	if !ok {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		return ""
	}
	var hdr struct {
		KeyID string `json:"kid"`
	}
	if json.Unmarshal(b, &hdr) != nil {
		return ""
	}
	return hdr.KeyID
}
