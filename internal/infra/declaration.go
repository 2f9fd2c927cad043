package infra

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
	"socialweb.computer/internal/market"
)

// Kind is the kind of a deployment: Infra or EphemeralInfra.
type Kind string

const (
	// KindInfra is an Infra, recorded in computer.socialweb.infra.
	KindInfra Kind = "Infra"
	// KindEphemeralInfra is an EphemeralInfra, recorded in computer.socialweb.ephemeralInfra.
	KindEphemeralInfra Kind = "EphemeralInfra"
)

// Collection is the NSID of the kind's records.
func (k Kind) Collection() string {
	if k == KindEphemeralInfra {
		return atinfra.EphemeralInfraNSID
	}
	return atinfra.InfraNSID
}

// prefix starts the names of the objects a deployment of this kind owns.
func (k Kind) prefix() string {
	if k == KindEphemeralInfra {
		return "einfra-"
	}
	return "infra-"
}

// Limits of a declaration that the API server enforces on spec; a record beyond them could
// never be pulled, so it does not decode.
const (
	maxDescriptionChars = 300
	maxContracts        = 64
	maxVMReadyTimeout   = 86400
	maxPorts            = 16
	// A contract's size, as the market payload and the CRD bound it.
	maxCPUs   = 1024
	minMemMiB = 64
	maxMemMiB = 4 << 20
)

// Declaration is the part of a deployment that both kcp and the record may change: the
// description and the contracts. Secrets, nodes, clusterRef and the record binding are
// kcp-only and never part of it.
type Declaration struct {
	Description string
	Contracts   []v1alpha1.InfraContract
}

// DeclarationFromSpec takes the declaration out of a spec. The result shares nothing with spec.
func DeclarationFromSpec(spec v1alpha1.InfraSpec) Declaration {
	d := Declaration{Description: spec.Description}
	for i := range spec.Contracts {
		d.Contracts = append(d.Contracts, *spec.Contracts[i].DeepCopy())
	}
	return d
}

// InvalidReason says why a record does not decode into a declaration.
type InvalidReason string

const (
	// InvalidMalformed: the record is not a JSON object of the lexicon's shape.
	InvalidMalformed InvalidReason = "Malformed"
	// InvalidBadType: $type is missing or names another collection.
	InvalidBadType InvalidReason = "BadType"
	// InvalidIndex: the record is the account's index (it has an index field), not a deployment.
	InvalidIndex InvalidReason = "IsIndex"
	// InvalidMissingName: a contract has no name.
	InvalidMissingName InvalidReason = "MissingName"
	// InvalidBadName: a contract name is not a DNS-1123 label.
	InvalidBadName InvalidReason = "BadName"
	// InvalidDuplicateName: two contracts share a name.
	InvalidDuplicateName InvalidReason = "DuplicateName"
	// InvalidUnknownState: a contract state is not staged, requested or released.
	InvalidUnknownState InvalidReason = "UnknownState"
	// InvalidBadField: a field holds a value the spec cannot take (too long, out of range, not a datetime).
	InvalidBadField InvalidReason = "BadField"
)

// InvalidRecordError is the error of a record that does not decode into a declaration. Such a
// record is neither pulled nor overwritten; the object reports RecordValid False with Reason.
type InvalidRecordError struct {
	Reason InvalidReason
	// Path is the field at fault, e.g. contracts[2].state.
	Path   string
	Detail string
}

func (e *InvalidRecordError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("invalid record: %s: %s", e.Reason, e.Detail)
	}
	return fmt.Sprintf("invalid record: %s at %s: %s", e.Reason, e.Path, e.Detail)
}

func invalid(r InvalidReason, path, format string, args ...any) *InvalidRecordError {
	return &InvalidRecordError{Reason: r, Path: path, Detail: fmt.Sprintf(format, args...)}
}

// decodedRecord is what a deployment record holds, for either collection.
type decodedRecord struct {
	Declaration Declaration
	Status      *atinfra.InfraStatus
	CreatedAt   string
	TTLSeconds  int64
	EndWhen     string
}

// DeclarationFromRecord decodes a record of kind's collection (its JSON, as getRecord returns
// the value) into a declaration. A record that does not decode returns an *InvalidRecordError.
// Record states become API states (staged -> Staged), datetimes are cut to whole seconds (what
// the API server stores) and policyArgs scalars become strings.
func DeclarationFromRecord(kind Kind, raw []byte) (Declaration, error) {
	r, err := decodeRecord(kind, raw)
	if err != nil {
		return Declaration{}, err
	}
	return r.Declaration, nil
}

func decodeRecord(kind Kind, raw []byte) (decodedRecord, error) {
	var head map[string]json.RawMessage
	if err := json.Unmarshal(raw, &head); err != nil || head == nil {
		return decodedRecord{}, invalid(InvalidMalformed, "", "not a JSON object")
	}
	var typ string
	if t, ok := head["$type"]; !ok || json.Unmarshal(t, &typ) != nil || typ != kind.Collection() {
		return decodedRecord{}, invalid(InvalidBadType, "$type", "want %q", kind.Collection())
	}
	if _, ok := head["index"]; ok {
		return decodedRecord{}, invalid(InvalidIndex, "index", "the index record is not a deployment")
	}
	var out decodedRecord
	var desc *string
	var contracts []atinfra.InfraContract
	if kind == KindEphemeralInfra {
		var r atinfra.EphemeralInfra
		if err := json.Unmarshal(raw, &r); err != nil {
			return decodedRecord{}, invalid(InvalidMalformed, "", "%v", err)
		}
		desc, contracts, out.Status, out.CreatedAt = r.Description, r.Contracts, r.Status, r.CreatedAt
		out.TTLSeconds = r.TTLSeconds
		if r.EndWhen != nil {
			out.EndWhen = *r.EndWhen
		}
	} else {
		var r atinfra.Infra
		if err := json.Unmarshal(raw, &r); err != nil {
			return decodedRecord{}, invalid(InvalidMalformed, "", "%v", err)
		}
		desc, contracts, out.Status, out.CreatedAt = r.Description, r.Contracts, r.Status, r.CreatedAt
	}
	if desc != nil {
		if utf8.RuneCountInString(*desc) > maxDescriptionChars {
			return decodedRecord{}, invalid(InvalidBadField, "description", "longer than %d characters", maxDescriptionChars)
		}
		out.Declaration.Description = *desc
	}
	if len(contracts) > maxContracts {
		return decodedRecord{}, invalid(InvalidBadField, "contracts", "more than %d contracts", maxContracts)
	}
	seen := map[string]bool{}
	for i, rc := range contracts {
		path := fmt.Sprintf("contracts[%d]", i)
		c, err := contractFromRecord(rc, path)
		if err != nil {
			return decodedRecord{}, err
		}
		if seen[c.Name] {
			return decodedRecord{}, invalid(InvalidDuplicateName, path+".name", "%q appears twice", c.Name)
		}
		seen[c.Name] = true
		out.Declaration.Contracts = append(out.Declaration.Contracts, c)
	}
	return out, nil
}

func contractFromRecord(rc atinfra.InfraContract, path string) (v1alpha1.InfraContract, error) {
	if rc.Name == "" {
		return v1alpha1.InfraContract{}, invalid(InvalidMissingName, path+".name", "a contract needs a name")
	}
	if errs := validation.IsDNS1123Label(rc.Name); len(errs) > 0 {
		return v1alpha1.InfraContract{}, invalid(InvalidBadName, path+".name", "%q: %s", rc.Name, strings.Join(errs, "; "))
	}
	state, ok := StateFromRecord(rc.State)
	if !ok {
		return v1alpha1.InfraContract{}, invalid(InvalidUnknownState, path+".state", "%q is not staged, requested or released", rc.State)
	}
	c := v1alpha1.InfraContract{
		Name:              rc.Name,
		State:             state,
		VMName:            deref(rc.VMName),
		UserData:          deref(rc.UserData),
		Policy:            deref(rc.Policy),
		BidderDids:        copyStrings(rc.BidderDids),
		DenyBidderDids:    copyStrings(rc.DenyBidderDids),
		SSHAuthorizedKeys: copyStrings(rc.SSHAuthorizedKeys),
	}
	if rc.RequireIsolation != nil {
		switch b := v1alpha1.IsolationBoundary(*rc.RequireIsolation); b {
		case v1alpha1.IsolationVM, v1alpha1.IsolationNamespace:
			c.RequireIsolation = b
		default:
			return v1alpha1.InfraContract{}, invalid(InvalidBadField, path+".requireIsolation", "%q is not vm or namespace", *rc.RequireIsolation)
		}
	}
	for i, l := range rc.RequireLayers {
		if !layerName.MatchString(l) || len(l) > 64 {
			return v1alpha1.InfraContract{}, invalid(InvalidBadField, fmt.Sprintf("%s.requireLayers[%d]", path, i), "%q is not a layer name (lowercase letters, digits and dashes)", l)
		}
		if slices.Contains(c.RequireLayers, l) {
			return v1alpha1.InfraContract{}, invalid(InvalidBadField, fmt.Sprintf("%s.requireLayers[%d]", path, i), "%q is listed twice", l)
		}
		c.RequireLayers = append(c.RequireLayers, l)
	}
	if len(rc.RequireLayers) > 16 {
		return v1alpha1.InfraContract{}, invalid(InvalidBadField, path+".requireLayers", "%d layers, at most 16", len(rc.RequireLayers))
	}
	if rc.RequireArch != nil {
		arch, err := market.ParseArch(*rc.RequireArch)
		if err != nil {
			return v1alpha1.InfraContract{}, invalid(InvalidBadField, path+".requireArch", "%q is not an architecture as kubernetes.io/arch names it (amd64, arm64)", *rc.RequireArch)
		}
		c.RequireArch = arch
	}
	if rc.ComputeKind != nil {
		switch k := v1alpha1.ComputeKind(*rc.ComputeKind); k {
		case v1alpha1.ComputeKindVM, v1alpha1.ComputeKindDeno, v1alpha1.ComputeKindNode:
			c.ComputeKind = k
		default:
			return v1alpha1.InfraContract{}, invalid(InvalidBadField, path+".computeKind", "%q is not vm, deno or node", *rc.ComputeKind)
		}
	}
	if rc.ReleaseRequestedAt != nil {
		t, err := time.Parse(time.RFC3339Nano, *rc.ReleaseRequestedAt)
		if err != nil {
			return v1alpha1.InfraContract{}, invalid(InvalidBadField, path+".releaseRequestedAt", "not a datetime: %v", err)
		}
		mt := metav1.NewTime(t.UTC().Truncate(time.Second))
		c.ReleaseRequestedAt = &mt
	}
	if rc.VMReadyTimeoutSec != nil {
		v := *rc.VMReadyTimeoutSec
		if v < 1 || v > maxVMReadyTimeout {
			return v1alpha1.InfraContract{}, invalid(InvalidBadField, path+".vmReadyTimeoutSec", "%d is outside 1..%d", v, maxVMReadyTimeout)
		}
		v32 := int32(v)
		c.VMReadyTimeoutSec = &v32
	}
	if rc.Cpus != nil {
		v := *rc.Cpus
		if v < 1 || v > maxCPUs {
			return v1alpha1.InfraContract{}, invalid(InvalidBadField, path+".cpus", "%d is outside 1..%d", v, maxCPUs)
		}
		c.CPUs = int32(v)
	}
	if rc.MemMiB != nil {
		v := *rc.MemMiB
		if v < minMemMiB || v > maxMemMiB {
			return v1alpha1.InfraContract{}, invalid(InvalidBadField, path+".memMiB", "%d is outside %d..%d", v, minMemMiB, maxMemMiB)
		}
		c.MemMiB = int32(v)
	}
	args, err := policyArgsFromRecord(rc.PolicyArgs)
	if err != nil {
		return v1alpha1.InfraContract{}, invalid(InvalidBadField, path+".policyArgs", "%v", err)
	}
	c.PolicyArgs = args
	if len(rc.Ports) > maxPorts {
		return v1alpha1.InfraContract{}, invalid(InvalidBadField, path+".ports", "more than %d ports", maxPorts)
	}
	seenPort := map[string]bool{}
	for j, p := range rc.Ports {
		pp := fmt.Sprintf("%s.ports[%d]", path, j)
		if errs := validation.IsDNS1123Label(p.Name); len(errs) > 0 {
			return v1alpha1.InfraContract{}, invalid(InvalidBadField, pp+".name", "%q: %s", p.Name, strings.Join(errs, "; "))
		}
		if seenPort[p.Name] {
			return v1alpha1.InfraContract{}, invalid(InvalidBadField, pp+".name", "%q appears twice", p.Name)
		}
		seenPort[p.Name] = true
		if p.Port < 1 || p.Port > 65535 {
			return v1alpha1.InfraContract{}, invalid(InvalidBadField, pp+".port", "%d is outside 1..65535", p.Port)
		}
		c.Ports = append(c.Ports, v1alpha1.ContractPort{Name: p.Name, Port: int32(p.Port)})
	}
	return c, nil
}

// policyArgsFromRecord turns the record's policyArgs object into the spec's string map: strings
// stay, numbers and booleans become their JSON text, null becomes empty. Nested values do not fit.
func policyArgsFromRecord(raw json.RawMessage) (map[string]string, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("not an object")
	}
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		v = bytes.TrimSpace(v)
		switch {
		case len(v) > 0 && v[0] == '"':
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return nil, fmt.Errorf("%s: %v", k, err)
			}
			out[k] = s
		case string(v) == "null":
			out[k] = ""
		case string(v) == "true" || string(v) == "false":
			out[k] = string(v)
		case len(v) > 0 && (v[0] == '-' || (v[0] >= '0' && v[0] <= '9')):
			out[k] = string(v)
		default:
			return nil, fmt.Errorf("%s: nested values are not supported", k)
		}
	}
	return out, nil
}

// contractToRecord renders one spec contract for a record.
// layerName is an isolation layer's short name, as offerings state them.
var layerName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

func contractToRecord(c v1alpha1.InfraContract) atinfra.InfraContract {
	rc := atinfra.InfraContract{
		Name:              c.Name,
		State:             StateToRecord(c.State),
		VMName:            ptrIf(c.VMName),
		UserData:          ptrIf(c.UserData),
		Policy:            ptrIf(c.Policy),
		ComputeKind:       ptrIf(string(c.ComputeKind)),
		RequireIsolation:  ptrIf(string(c.RequireIsolation)),
		RequireLayers:     copyStrings(c.RequireLayers),
		RequireArch:       ptrIf(c.RequireArch),
		BidderDids:        copyStrings(c.BidderDids),
		DenyBidderDids:    copyStrings(c.DenyBidderDids),
		SSHAuthorizedKeys: copyStrings(c.SSHAuthorizedKeys),
	}
	if c.ReleaseRequestedAt != nil {
		s := formatTime(c.ReleaseRequestedAt.Time)
		rc.ReleaseRequestedAt = &s
	}
	if c.VMReadyTimeoutSec != nil {
		v := int64(*c.VMReadyTimeoutSec)
		rc.VMReadyTimeoutSec = &v
	}
	if c.CPUs > 0 {
		v := int64(c.CPUs)
		rc.Cpus = &v
	}
	if c.MemMiB > 0 {
		v := int64(c.MemMiB)
		rc.MemMiB = &v
	}
	if len(c.PolicyArgs) > 0 {
		b, _ := json.Marshal(c.PolicyArgs) // a map of strings always marshals
		rc.PolicyArgs = b
	}
	for _, p := range c.Ports {
		rc.Ports = append(rc.Ports, atinfra.InfraPort{Name: p.Name, Port: int64(p.Port)})
	}
	return rc
}

// Hash is the declaration hash: the sha256 (hex) of the declaration's canonical JSON. The
// canonical form sorts contracts by name and object keys alphabetically, omits empty optional
// fields, writes states in the record's vocabulary and fills the defaults the API server
// applies (state staged, computeKind vm), so that defaulting, a reorder of contracts or a
// round trip through the record never looks like an edit.
func Hash(d Declaration) string {
	sum := sha256.Sum256(CanonicalJSON(d))
	return hex.EncodeToString(sum[:])
}

// canonicalContract and canonicalDeclaration are the canonical form: fields in the byte order
// of their JSON keys, empty optional fields omitted.
type canonicalContract struct {
	BidderDids         []string          `json:"bidderDids,omitempty"`
	ComputeKind        string            `json:"computeKind"`
	CPUs               int32             `json:"cpus,omitempty"`
	DenyBidderDids     []string          `json:"denyBidderDids,omitempty"`
	MemMiB             int32             `json:"memMiB,omitempty"`
	Name               string            `json:"name"`
	Policy             string            `json:"policy,omitempty"`
	PolicyArgs         map[string]string `json:"policyArgs,omitempty"`
	Ports              []canonicalPort   `json:"ports,omitempty"`
	ReleaseRequestedAt string            `json:"releaseRequestedAt,omitempty"`
	RequireArch        string            `json:"requireArch,omitempty"`
	RequireIsolation   string            `json:"requireIsolation,omitempty"`
	RequireLayers      []string          `json:"requireLayers,omitempty"`
	SSHAuthorizedKeys  []string          `json:"sshAuthorizedKeys,omitempty"`
	State              string            `json:"state"`
	UserData           string            `json:"userData,omitempty"`
	VMName             string            `json:"vmName,omitempty"`
	VMReadyTimeoutSec  *int32            `json:"vmReadyTimeoutSec,omitempty"`
}

type canonicalPort struct {
	Name string `json:"name"`
	Port int32  `json:"port"`
}

type canonicalDeclaration struct {
	Contracts   []canonicalContract `json:"contracts,omitempty"`
	Description string              `json:"description,omitempty"`
}

// CanonicalJSON is the byte string Hash digests.
func CanonicalJSON(d Declaration) []byte {
	doc := canonicalDeclaration{Description: d.Description}
	for _, c := range d.Contracts {
		kind := string(c.ComputeKind)
		if kind == "" {
			kind = string(v1alpha1.ComputeKindVM)
		}
		cc := canonicalContract{
			BidderDids: c.BidderDids, ComputeKind: kind, CPUs: c.CPUs, DenyBidderDids: c.DenyBidderDids, MemMiB: c.MemMiB, Name: c.Name,
			Policy: c.Policy, PolicyArgs: c.PolicyArgs, RequireIsolation: string(c.RequireIsolation), RequireArch: c.RequireArch, RequireLayers: c.RequireLayers, SSHAuthorizedKeys: c.SSHAuthorizedKeys,
			State: StateToRecord(c.State), UserData: c.UserData, VMName: c.VMName, VMReadyTimeoutSec: c.VMReadyTimeoutSec,
		}
		if c.ReleaseRequestedAt != nil {
			cc.ReleaseRequestedAt = formatTime(c.ReleaseRequestedAt.Time)
		}
		for _, p := range c.Ports { // a map keyed by name: its order is not an edit
			cc.Ports = append(cc.Ports, canonicalPort{Name: p.Name, Port: p.Port})
		}
		sort.Slice(cc.Ports, func(i, j int) bool { return cc.Ports[i].Name < cc.Ports[j].Name })
		doc.Contracts = append(doc.Contracts, cc)
	}
	sort.SliceStable(doc.Contracts, func(i, j int) bool { return doc.Contracts[i].Name < doc.Contracts[j].Name })
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(doc) // strings, slices, a string map and an int always encode
	return bytes.TrimRight(buf.Bytes(), "\n")
}

// StateToRecord maps an API contract state to the record's word; empty is staged (the default).
func StateToRecord(s v1alpha1.ContractState) string {
	switch s {
	case "", v1alpha1.ContractStaged:
		return atinfra.InfraContractStateStaged
	case v1alpha1.ContractRequested:
		return atinfra.InfraContractStateRequested
	case v1alpha1.ContractReleased:
		return atinfra.InfraContractStateReleased
	}
	return strings.ToLower(string(s))
}

// StateFromRecord maps a record contract state to the API's; ok is false for an unknown word.
func StateFromRecord(s string) (v1alpha1.ContractState, bool) {
	switch s {
	case atinfra.InfraContractStateStaged:
		return v1alpha1.ContractStaged, true
	case atinfra.InfraContractStateRequested:
		return v1alpha1.ContractRequested, true
	case atinfra.InfraContractStateReleased:
		return v1alpha1.ContractReleased, true
	}
	return "", false
}

var contractPhases = []v1alpha1.InfraContractPhase{
	v1alpha1.InfraContractStaged, v1alpha1.InfraContractRequesting, v1alpha1.InfraContractDeployed,
	v1alpha1.InfraContractReleasing, v1alpha1.InfraContractReleased, v1alpha1.InfraContractFailed,
}

var infraPhases = []v1alpha1.InfraPhase{
	v1alpha1.InfraPending, v1alpha1.InfraStaged, v1alpha1.InfraDeploying, v1alpha1.InfraDeployed,
	v1alpha1.InfraReleasing, v1alpha1.InfraReleased, v1alpha1.InfraDegraded, v1alpha1.InfraEnding,
	v1alpha1.InfraDeleting, v1alpha1.InfraEnded,
}

// ContractPhaseToRecord maps an observed contract phase to the record's word (Deployed -> deployed).
func ContractPhaseToRecord(p v1alpha1.InfraContractPhase) string { return strings.ToLower(string(p)) }

// ContractPhaseFromRecord maps a record contract phase back; ok is false for an unknown word.
func ContractPhaseFromRecord(s string) (v1alpha1.InfraContractPhase, bool) {
	for _, p := range contractPhases {
		if ContractPhaseToRecord(p) == s {
			return p, true
		}
	}
	return "", false
}

// PhaseToRecord maps a deployment phase to the record's word (Deploying -> deploying).
func PhaseToRecord(p v1alpha1.InfraPhase) string { return strings.ToLower(string(p)) }

// PhaseFromRecord maps a record deployment phase back; ok is false for an unknown word.
func PhaseFromRecord(s string) (v1alpha1.InfraPhase, bool) {
	for _, p := range infraPhases {
		if PhaseToRecord(p) == s {
			return p, true
		}
	}
	return "", false
}

// End reasons, as status.endReason carries them. The record writes them in lower case.
const (
	EndReasonDeadline = "Deadline"
	EndReasonComplete = "Complete"
	EndReasonDeleted  = "Deleted"
)

// EndReasonToRecord maps a status end reason to the record's word (Deadline -> deadline).
func EndReasonToRecord(r string) string { return strings.ToLower(r) }

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func ptrIf(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func copyStrings(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return append([]string(nil), s...)
}

// itoa is strconv.Itoa, named for the successor rkeys.
func itoa(n int) string { return strconv.Itoa(n) }
