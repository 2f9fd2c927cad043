package tenant

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Who created what in a tenant cluster. A revoked identity must lose what it made for
// itself (ServiceAccounts, bindings, tokens), and the cluster's own objects cannot say who
// made them: an annotation stamped at admission can be edited or removed later by anyone
// with update rights (the creator first), and managedFields' manager is a name the client
// chooses (fieldManager) and that any update may clear. The apiserver's audit log is written
// by the apiserver itself, from the authenticated request, into a file in the cluster's
// directory on the host: nothing a tenant can reach writes or truncates it. So the tenant
// apiserver audits exactly the creates that matter (auditPolicy) and revocation reads it.

// auditPolicy records, with the authenticated user (and the impersonated one, and the
// credential a token request was made with), the creates of ServiceAccounts and RBAC
// bindings with the object created (its UID, so only that object is ever removed), and of
// service-account tokens at Metadata level: the token itself is never written; the
// apiserver's annotation authentication.kubernetes.io/issued-credential-id names it
// (JTI=...). Nothing else is audited: no other request pays for it. Kubelets' token
// requests for their pods (a refresh per pod every ~48 min) are left out: a node is no
// member, and they would be nearly all of the log.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
omitManagedFields: true
rules:
- level: None
  userGroups: ["system:nodes"]
  resources:
  - group: ""
    resources: ["serviceaccounts/token"]
- level: RequestResponse
  verbs: ["create"]
  resources:
  - group: ""
    resources: ["serviceaccounts"]
  - group: "rbac.authorization.k8s.io"
    resources: ["rolebindings", "clusterrolebindings"]
- level: Metadata
  verbs: ["create"]
  resources:
  - group: ""
    resources: ["serviceaccounts/token"]
- level: None
`

// credentialIDKey is the user extra the apiserver sets to the credential a request was
// authenticated with (JTI=... for a service-account token).
const credentialIDKey = "authentication.kubernetes.io/credential-id"

// issuedCredentialAnnotation is the audit annotation naming the token a TokenRequest issued.
const issuedCredentialAnnotation = "authentication.kubernetes.io/issued-credential-id"

// AuditUser is the part of an audit event's user this package reads.
type AuditUser struct {
	Username string              `json:"username"`
	Extra    map[string][]string `json:"extra,omitempty"`
}

// AuditEvent is the part of a Kubernetes audit event (audit.k8s.io/v1 Event) revocation reads.
type AuditEvent struct {
	Stage            string     `json:"stage"`
	Verb             string     `json:"verb"`
	User             AuditUser  `json:"user"`
	ImpersonatedUser *AuditUser `json:"impersonatedUser,omitempty"`
	ObjectRef        *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource,omitempty"`
		Namespace   string `json:"namespace,omitempty"`
		Name        string `json:"name,omitempty"`
	} `json:"objectRef,omitempty"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus,omitempty"`
	ResponseObject *struct {
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace,omitempty"`
			UID       string `json:"uid"`
		} `json:"metadata"`
	} `json:"responseObject,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// CreatedObject is an object an identity created: Resource is serviceaccounts,
// rolebindings or clusterrolebindings.
type CreatedObject struct {
	Resource  string `json:"resource"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// String is resource/namespace/name, or resource/name for a cluster-scoped object.
func (o CreatedObject) String() string {
	r := strings.TrimSuffix(o.Resource, "s")
	if o.Namespace == "" {
		return r + "/" + o.Name
	}
	return r + "/" + o.Namespace + "/" + o.Name
}

// Attribution is what one identity made in a cluster, transitively: the objects, the
// ServiceAccounts it made (as usernames), and the tokens it requested (credential IDs,
// JTI=...), including what was made with those ServiceAccounts and tokens in turn.
type Attribution struct {
	Objects         []CreatedObject
	ServiceAccounts []string
	Credentials     []string
}

// serviceAccountUser is the username of a ServiceAccount's tokens.
func serviceAccountUser(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// Attribute is what the identity did (the DID as a user, through its own ServiceAccount, or
// through anything attributed to it) according to the audit events, in order: a request is
// the identity's when its user or impersonated user is an attributed username, or its
// credential an attributed token. Repeated until nothing new is attributed, so a token made
// with a token the identity made is attributed too, whatever the order of the log. Only
// completed, successful requests count.
func Attribute(events []AuditEvent, did string) Attribution {
	users := map[string]bool{did: true, serviceAccountUser(OwnerNamespace, OwnerServiceAccount(did)): true}
	creds := map[string]bool{}
	objects := map[CreatedObject]bool{}
	var a Attribution
	ours := func(u *AuditUser) bool {
		if u == nil {
			return false
		}
		if users[u.Username] {
			return true
		}
		for _, c := range u.Extra[credentialIDKey] {
			if creds[c] {
				return true
			}
		}
		return false
	}
	for changed := true; changed; {
		changed = false
		for i := range events {
			e := &events[i]
			if e.Stage != "ResponseComplete" || e.Verb != "create" || e.ObjectRef == nil ||
				e.ResponseStatus == nil || e.ResponseStatus.Code < 200 || e.ResponseStatus.Code > 299 {
				continue
			}
			if !ours(&e.User) && !ours(e.ImpersonatedUser) {
				continue
			}
			ref := e.ObjectRef
			switch {
			case ref.Resource == "serviceaccounts" && ref.Subresource == "token":
				if c := e.Annotations[issuedCredentialAnnotation]; c != "" && !creds[c] {
					creds[c] = true
					a.Credentials = append(a.Credentials, c)
					changed = true
				}
			case ref.Subresource == "" && (ref.Resource == "serviceaccounts" || ref.Resource == "rolebindings" || ref.Resource == "clusterrolebindings"):
				if e.ResponseObject == nil || e.ResponseObject.Metadata.UID == "" {
					continue
				}
				md := e.ResponseObject.Metadata
				o := CreatedObject{Resource: ref.Resource, Namespace: md.Namespace, Name: md.Name, UID: md.UID}
				if objects[o] {
					continue
				}
				objects[o] = true
				a.Objects = append(a.Objects, o)
				changed = true
				if o.Resource == "serviceaccounts" {
					u := serviceAccountUser(o.Namespace, o.Name)
					if !users[u] {
						users[u] = true
						a.ServiceAccounts = append(a.ServiceAccounts, u)
					}
				}
			}
		}
	}
	slices.Sort(a.Credentials)
	slices.Sort(a.ServiceAccounts)
	slices.SortFunc(a.Objects, func(x, y CreatedObject) int { return strings.Compare(x.String(), y.String()) })
	return a
}

// ReadAudit parses an audit log (one JSON event a line). Lines that are not events (a line
// cut by a crash) are skipped; a missing file is no events.
func ReadAudit(path string) ([]AuditEvent, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseAudit(f)
}

func parseAudit(r io.Reader) ([]AuditEvent, error) {
	var out []AuditEvent
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			var e AuditEvent
			if json.Unmarshal(line, &e) == nil {
				out = append(out, e)
			}
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("reading the audit log: %w", err)
		}
	}
}

// AttributionFor reads the cluster's audit log (the files the apiserver rotated out first,
// audit-<time>.log, oldest first, then audit.log) and attributes to did what it made there.
func AttributionFor(l Layout, did string) (Attribution, error) {
	events, err := ReadAuditLogs(l)
	if err != nil {
		return Attribution{}, err
	}
	return Attribute(events, did), nil
}

// ReadAuditLogs reads every audit log of the cluster, oldest first.
func ReadAuditLogs(l Layout) ([]AuditEvent, error) {
	rotated, err := filepath.Glob(filepath.Join(l.Dir, "audit-*.log"))
	if err != nil {
		return nil, err
	}
	slices.Sort(rotated) // the names are timestamps
	var all []AuditEvent
	for _, f := range append(rotated, l.AuditLog()) {
		events, err := ReadAudit(f)
		if err != nil {
			return nil, err
		}
		all = append(all, events...)
	}
	return all, nil
}
