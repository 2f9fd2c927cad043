package infra

import (
	"encoding/json"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
)

// StatusWriteInterval is the least time between two writes of a record whose only change is
// in its status and whose phases did not change.
const StatusWriteInterval = time.Minute

// Defaults of an EphemeralInfra, as the API server fills them.
const (
	DefaultTTLSeconds = 3600
	MinTTLSeconds     = 60
)

const (
	maxMessageBytes     = 4096
	maxMessageGraphemes = 1024
)

// Rendered is the record value of one deployment: exactly one of Infra and EphemeralInfra is set.
type Rendered struct {
	Infra          *atinfra.Infra
	EphemeralInfra *atinfra.EphemeralInfra
}

// Collection is the NSID the record is written to.
func (r Rendered) Collection() string {
	if r.EphemeralInfra != nil {
		return atinfra.EphemeralInfraNSID
	}
	return atinfra.InfraNSID
}

// Status is the record's status part.
func (r Rendered) Status() *atinfra.InfraStatus {
	if r.EphemeralInfra != nil {
		return r.EphemeralInfra.Status
	}
	if r.Infra != nil {
		return r.Infra.Status
	}
	return nil
}

// MarshalJSON writes the record with its $type, as the AtprotoRecord child's spec.record.
func (r Rendered) MarshalJSON() ([]byte, error) {
	if r.EphemeralInfra != nil {
		return json.Marshal(r.EphemeralInfra)
	}
	return json.Marshal(r.Infra)
}

// RenderRecord is the record of a deployment: its declaration (description and contracts from
// spec), its observed status and createdAt (the object's creationTimestamp, so a render is
// stable; now only stands in while the object has none). An Infra passes its spec and status
// wrapped in the ephemeral types and leaves TTLSeconds, EndWhen and ExpiresAt empty.
//
// A deleted object (deletionTimestamp set) renders its final write: phase ended, endedAt the
// deletion time and endReason deleted, unless the deployment had already ended (then its own
// endedAt and endReason stay, they are set once).
//
// Nothing kcp-only is rendered: spec.secrets, spec.nodes, spec.clusterRef and spec.record
// never reach a record, which is public. The error is the lexicon's verdict on the result (a
// description the API accepts may still be too long for the lexicon).
func RenderRecord(kind Kind, meta metav1.ObjectMeta, spec v1alpha1.EphemeralInfraSpec, status v1alpha1.EphemeralInfraStatus, now time.Time) (Rendered, error) {
	created := meta.CreationTimestamp.Time
	if created.IsZero() {
		created = now
	}
	var contracts []atinfra.InfraContract
	for _, c := range spec.Contracts {
		contracts = append(contracts, contractToRecord(c))
	}
	st := renderStatus(kind, meta, status)
	if kind == KindEphemeralInfra {
		ttl := int64(spec.TTLSeconds)
		if ttl == 0 {
			ttl = DefaultTTLSeconds
		}
		endWhen := atinfra.EphemeralInfraEndWhenDefault
		if spec.EndWhen != "" {
			endWhen = strings.ToLower(string(spec.EndWhen))
		}
		r := &atinfra.EphemeralInfra{
			Contracts:   contracts,
			CreatedAt:   formatTime(created),
			Description: ptrIf(spec.Description),
			EndWhen:     &endWhen,
			Status:      st,
			TTLSeconds:  ttl,
		}
		return Rendered{EphemeralInfra: r}, r.Validate()
	}
	st.ExpiresAt = nil
	r := &atinfra.Infra{
		Contracts:   contracts,
		CreatedAt:   formatTime(created),
		Description: ptrIf(spec.Description),
		Status:      st,
	}
	return Rendered{Infra: r}, r.Validate()
}

func renderStatus(kind Kind, meta metav1.ObjectMeta, status v1alpha1.EphemeralInfraStatus) *atinfra.InfraStatus {
	phase := status.Phase
	if phase == "" {
		phase = v1alpha1.InfraPending
	}
	st := &atinfra.InfraStatus{}
	endedAt, reason := status.EndedAt, status.EndReason
	if meta.DeletionTimestamp != nil {
		phase = v1alpha1.InfraEnded
		if endedAt == nil {
			endedAt = meta.DeletionTimestamp
		}
		if reason == "" {
			reason = EndReasonDeleted
		}
	}
	p := PhaseToRecord(phase)
	st.Phase = &p
	if endedAt != nil {
		s := formatTime(endedAt.Time)
		st.EndedAt = &s
	}
	if reason != "" {
		s := EndReasonToRecord(reason)
		st.EndReason = &s
	}
	if kind == KindEphemeralInfra && status.ExpiresAt != nil {
		s := formatTime(status.ExpiresAt.Time)
		st.ExpiresAt = &s
	}
	for _, c := range status.Contracts {
		cs := atinfra.InfraContractStatus{
			Name:    c.Name,
			Winner:  ptrIf(c.Winner),
			Receipt: ptrIf(c.Receipt),
			Message: ptrIf(truncateMessage(c.Message)),
		}
		if c.Phase != "" {
			s := ContractPhaseToRecord(c.Phase)
			cs.Phase = &s
		}
		st.Contracts = append(st.Contracts, cs)
	}
	return st
}

// truncateMessage keeps a message within the lexicon's 4096 bytes and 1024 graphemes (counted
// as runes, which are never fewer than graphemes).
func truncateMessage(s string) string {
	if len(s) <= maxMessageBytes && utf8.RuneCountInString(s) <= maxMessageGraphemes {
		return s
	}
	n, runes := 0, 0
	for i, r := range s {
		if runes == maxMessageGraphemes || i+utf8.RuneLen(r) > maxMessageBytes {
			break
		}
		n, runes = i+utf8.RuneLen(r), runes+1
	}
	return s[:n]
}

// StatusWriteDue says whether a record whose declaration did not change should be written for
// its status: never when the status is unchanged; at once when the record has no status yet,
// when the deployment phase, any contract's phase or the end (endedAt, endReason) changed; and
// otherwise (a message, a winner, a receipt) at most once per StatusWriteInterval since
// lastWriteAt.
func StatusWriteDue(last *atinfra.InfraStatus, next *atinfra.InfraStatus, lastWriteAt, now time.Time) bool {
	if reflect.DeepEqual(last, next) {
		return false
	}
	if last == nil || next == nil || phasesDiffer(last, next) {
		return true
	}
	return !now.Before(lastWriteAt.Add(StatusWriteInterval))
}

func phasesDiffer(a, b *atinfra.InfraStatus) bool {
	if deref(a.Phase) != deref(b.Phase) || deref(a.EndedAt) != deref(b.EndedAt) || deref(a.EndReason) != deref(b.EndReason) {
		return true
	}
	phases := func(s *atinfra.InfraStatus) map[string]string {
		m := map[string]string{}
		for _, c := range s.Contracts {
			m[c.Name] = deref(c.Phase)
		}
		return m
	}
	return !reflect.DeepEqual(phases(a), phases(b))
}
