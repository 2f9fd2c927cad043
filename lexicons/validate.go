package lexicons

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/lexicon"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/rivo/uniseg"
)

// Reason says what is wrong with a record, in a word a condition or an XRPC
// error can carry.
type Reason string

const (
	// UnknownCollection: no record lexicon is defined for the collection.
	UnknownCollection Reason = "UnknownCollection"
	// BadType: the record's $type is missing or is not the collection, or a
	// union member's $type is missing or not allowed.
	BadType Reason = "BadType"
	// MissingField: a required field is absent.
	MissingField Reason = "MissingField"
	// WrongType: a field holds the wrong kind of value (a number where a
	// string belongs, a fraction where an integer belongs, null, ...).
	WrongType Reason = "WrongType"
	// TooLong: a string (in UTF-8 bytes or graphemes) or an array is longer
	// than its lexicon allows.
	TooLong Reason = "TooLong"
	// TooShort: a string or an array is shorter than its lexicon allows.
	TooShort Reason = "TooShort"
	// OutOfRange: an integer is below its minimum or above its maximum.
	OutOfRange Reason = "OutOfRange"
	// BadFormat: a string is not a valid did, at-uri, datetime, cid, ...
	BadFormat Reason = "BadFormat"
	// NotAllowed: a value is not one of the lexicon's enum or const values.
	NotAllowed Reason = "NotAllowed"
	// TooLarge: the whole record is larger than atproto allows.
	TooLarge Reason = "TooLarge"
	// Invalid: the record breaks a rule not covered by the reasons above
	// (the atproto data model, or a check that only indigo's validator makes).
	Invalid Reason = "Invalid"
)

// MaxRecordJSONBytes is the largest record, encoded as JSON, that
// ValidateRecord accepts (the atproto limit that indigo applies).
const MaxRecordJSONBytes = atdata.MAX_JSON_RECORD_SIZE

// ValidationError says why a record does not match its lexicon: which
// collection, where in the record (Path, e.g. "contracts[0].name"; empty for
// the record itself), what kind of problem (Reason) and the details.
type ValidationError struct {
	Collection string
	Path       string
	Reason     Reason
	Detail     string
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString(e.Collection)
	if e.Path != "" {
		b.WriteString(": ")
		b.WriteString(e.Path)
	}
	b.WriteString(": ")
	b.WriteString(string(e.Reason))
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// ReasonOf returns the Reason of a *ValidationError in err's chain, or "" if
// there is none.
func ReasonOf(err error) Reason {
	var ve *ValidationError
	if errors.As(err, &ve) {
		return ve.Reason
	}
	return ""
}

// ValidateJSON validates a record given as JSON bytes. See ValidateRecord.
func ValidateJSON(collection string, data []byte) error {
	if len(data) > MaxRecordJSONBytes {
		return &ValidationError{Collection: collection, Reason: TooLarge,
			Detail: fmt.Sprintf("%d bytes of JSON, at most %d", len(data), MaxRecordJSONBytes)}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return &ValidationError{Collection: collection, Reason: Invalid, Detail: "not JSON: " + err.Error()}
	}
	if dec.More() {
		return &ValidationError{Collection: collection, Reason: Invalid, Detail: "trailing data after the JSON object"}
	}
	m, ok := v.(map[string]any)
	if !ok {
		return &ValidationError{Collection: collection, Reason: WrongType, Detail: "a record must be a JSON object, got " + kindOf(v)}
	}
	return validate(collection, m, len(data))
}

// ValidateRecord checks record against the lexicon of collection and returns
// nil or a *ValidationError. The record may come from encoding/json (numbers
// as float64 or json.Number) or be built in Go (int, int64, []string, ...):
// it is normalised through JSON first.
//
// The checks are made twice: by a walk of our own, which reports the first
// problem (in sorted field order, so the answer is stable) with its path and
// reason, and then by indigo's lexicon.ValidateRecord, so that a record passes
// only if indigo's validator agrees.
func ValidateRecord(collection string, record map[string]any) error {
	b, err := json.Marshal(record)
	if err != nil {
		return &ValidationError{Collection: collection, Reason: Invalid, Detail: "cannot encode as JSON: " + err.Error()}
	}
	return ValidateJSON(collection, b)
}

func validate(collection string, rec map[string]any, size int) error {
	cat, err := Catalog()
	if err != nil {
		return err
	}
	if !Known(collection) {
		return &ValidationError{Collection: collection, Reason: UnknownCollection,
			Detail: "no record lexicon is defined for this collection"}
	}
	t, ok := rec["$type"]
	if !ok {
		return &ValidationError{Collection: collection, Path: "$type", Reason: BadType,
			Detail: fmt.Sprintf("missing; want %q", collection)}
	}
	if ts, ok := t.(string); !ok || ts != collection {
		return &ValidationError{Collection: collection, Path: "$type", Reason: BadType,
			Detail: fmt.Sprintf("is %s; want %q", short(t), collection)}
	}
	s, err := cat.Resolve(collection)
	if err != nil {
		return &ValidationError{Collection: collection, Reason: UnknownCollection, Detail: err.Error()}
	}
	rs, ok := s.Def.(lexicon.SchemaRecord)
	if !ok {
		return &ValidationError{Collection: collection, Reason: UnknownCollection, Detail: "not a record lexicon"}
	}
	w := walker{cat: cat, collection: collection}
	if ve := w.object(collection, rs.Record, rec, ""); ve != nil {
		return ve
	}
	// The second opinion: indigo's validator over the atproto data model form.
	b, err := json.Marshal(rec)
	if err != nil {
		return &ValidationError{Collection: collection, Reason: Invalid, Detail: err.Error()}
	}
	data, err := atdata.UnmarshalJSON(b)
	if err != nil {
		return &ValidationError{Collection: collection, Reason: Invalid, Detail: "atproto data model: " + err.Error()}
	}
	if err := lexicon.ValidateRecord(cat, data, collection, 0); err != nil {
		return &ValidationError{Collection: collection, Reason: Invalid, Detail: err.Error()}
	}
	return nil
}

type walker struct {
	cat        lexicon.Catalog
	collection string
}

func (w walker) fail(path string, r Reason, format string, args ...any) *ValidationError {
	return &ValidationError{Collection: w.collection, Path: path, Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// fullRef turns a ref as written in the lexicon of base ("#frag", "nsid",
// "nsid#frag") into its canonical form ("nsid" for main, else "nsid#frag").
func fullRef(base, ref string) string {
	if strings.HasPrefix(ref, "#") {
		ref = base + ref
	}
	return strings.TrimSuffix(ref, "#main")
}

func nsidOf(id string) string {
	if i := strings.IndexByte(id, '#'); i >= 0 {
		return id[:i]
	}
	return id
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func (w walker) value(base string, def any, v any, path string) *ValidationError {
	switch s := def.(type) {
	case lexicon.SchemaObject:
		m, ok := v.(map[string]any)
		if !ok {
			return w.fail(path, WrongType, "want an object, got %s", kindOf(v))
		}
		return w.object(base, s, m, path)
	case lexicon.SchemaString:
		return w.str(s, v, path)
	case lexicon.SchemaInteger:
		return w.integer(s, v, path)
	case lexicon.SchemaBoolean:
		b, ok := v.(bool)
		if !ok {
			return w.fail(path, WrongType, "want a boolean, got %s", kindOf(v))
		}
		if s.Const != nil && b != *s.Const {
			return w.fail(path, NotAllowed, "must be %v", *s.Const)
		}
		return nil
	case lexicon.SchemaArray:
		a, ok := v.([]any)
		if !ok {
			return w.fail(path, WrongType, "want an array, got %s", kindOf(v))
		}
		if s.MaxLength != nil && len(a) > *s.MaxLength {
			return w.fail(path, TooLong, "%d items, at most %d", len(a), *s.MaxLength)
		}
		if s.MinLength != nil && len(a) < *s.MinLength {
			return w.fail(path, TooShort, "%d items, at least %d", len(a), *s.MinLength)
		}
		for i, item := range a {
			if ve := w.value(base, s.Items.Inner, item, fmt.Sprintf("%s[%d]", path, i)); ve != nil {
				return ve
			}
		}
		return nil
	case lexicon.SchemaRef:
		ref := fullRef(base, s.Ref)
		next, err := w.cat.Resolve(ref)
		if err != nil {
			return w.fail(path, Invalid, "lexicon ref %s does not resolve: %v", ref, err)
		}
		return w.value(nsidOf(next.ID), next.Def, v, path)
	case lexicon.SchemaUnion:
		return w.union(base, s, v, path)
	case lexicon.SchemaUnknown:
		if _, ok := v.(map[string]any); !ok {
			return w.fail(path, WrongType, "want an object, got %s", kindOf(v))
		}
		return nil
	case lexicon.SchemaBytes, lexicon.SchemaCIDLink, lexicon.SchemaBlob:
		// Not used by our lexicons; left to indigo's validator.
		if _, ok := v.(map[string]any); !ok {
			return w.fail(path, WrongType, "want an object, got %s", kindOf(v))
		}
		return nil
	default:
		return w.fail(path, Invalid, "lexicon type %T cannot hold data", def)
	}
}

func (w walker) object(base string, s lexicon.SchemaObject, m map[string]any, path string) *ValidationError {
	for _, k := range s.Required {
		if _, ok := m[k]; !ok {
			return w.fail(join(path, k), MissingField, "required")
		}
	}
	keys := make([]string, 0, len(s.Properties))
	for k := range s.Properties {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, ok := m[k]
		if !ok {
			continue
		}
		if v == nil {
			if s.IsNullable(k) {
				continue
			}
			return w.fail(join(path, k), WrongType, "null is not allowed; leave the field out instead")
		}
		if ve := w.value(base, s.Properties[k].Inner, v, join(path, k)); ve != nil {
			return ve
		}
	}
	return nil
}

func (w walker) union(base string, s lexicon.SchemaUnion, v any, path string) *ValidationError {
	m, ok := v.(map[string]any)
	if !ok {
		return w.fail(path, WrongType, "want an object with a $type, got %s", kindOf(v))
	}
	refs := make([]string, len(s.Refs))
	for i, r := range s.Refs {
		refs[i] = fullRef(base, r)
	}
	tv, ok := m["$type"]
	if !ok {
		return w.fail(join(path, "$type"), BadType, "missing; want one of %s", strings.Join(refs, ", "))
	}
	t, ok := tv.(string)
	if !ok || t == "" {
		return w.fail(join(path, "$type"), BadType, "is %s; want one of %s", short(tv), strings.Join(refs, ", "))
	}
	t = strings.TrimSuffix(t, "#main")
	if !slices.Contains(refs, t) {
		if s.Closed != nil && *s.Closed {
			return w.fail(join(path, "$type"), BadType, "is %q; want one of %s", t, strings.Join(refs, ", "))
		}
		// An open union accepts other types; check them when we know them.
		next, err := w.cat.Resolve(t)
		if err != nil {
			return nil
		}
		return w.value(nsidOf(next.ID), next.Def, v, path)
	}
	next, err := w.cat.Resolve(t)
	if err != nil {
		return w.fail(path, Invalid, "lexicon ref %s does not resolve: %v", t, err)
	}
	return w.value(nsidOf(next.ID), next.Def, v, path)
}

func (w walker) str(s lexicon.SchemaString, v any, path string) *ValidationError {
	str, ok := v.(string)
	if !ok {
		return w.fail(path, WrongType, "want a string, got %s", kindOf(v))
	}
	if !utf8.ValidString(str) {
		return w.fail(path, Invalid, "not valid UTF-8")
	}
	if s.MaxLength != nil && len(str) > *s.MaxLength {
		return w.fail(path, TooLong, "%d bytes, at most %d", len(str), *s.MaxLength)
	}
	if s.MinLength != nil && len(str) < *s.MinLength {
		return w.fail(path, TooShort, "%d bytes, at least %d", len(str), *s.MinLength)
	}
	if s.MaxGraphemes != nil || s.MinGraphemes != nil {
		n := uniseg.GraphemeClusterCount(str)
		if s.MaxGraphemes != nil && n > *s.MaxGraphemes {
			return w.fail(path, TooLong, "%d characters, at most %d", n, *s.MaxGraphemes)
		}
		if s.MinGraphemes != nil && n < *s.MinGraphemes {
			return w.fail(path, TooShort, "%d characters, at least %d", n, *s.MinGraphemes)
		}
	}
	if s.Const != nil && str != *s.Const {
		return w.fail(path, NotAllowed, "is %s; must be %q", short(str), *s.Const)
	}
	if len(s.Enum) > 0 && !slices.Contains(s.Enum, str) {
		return w.fail(path, NotAllowed, "is %s; must be one of %s", short(str), strings.Join(s.Enum, ", "))
	}
	if s.Format != nil {
		if err := checkFormat(*s.Format, str); err != nil {
			return w.fail(path, BadFormat, "%s is not a valid %s: %v", short(str), *s.Format, err)
		}
	}
	return nil
}

func checkFormat(format, v string) error {
	var err error
	switch format {
	case "at-identifier":
		_, err = syntax.ParseAtIdentifier(v)
	case "at-uri":
		_, err = syntax.ParseATURI(v)
	case "cid":
		_, err = syntax.ParseCID(v)
	case "datetime":
		_, err = syntax.ParseDatetime(v)
	case "did":
		_, err = syntax.ParseDID(v)
	case "handle":
		_, err = syntax.ParseHandle(v)
	case "nsid":
		_, err = syntax.ParseNSID(v)
	case "uri":
		_, err = syntax.ParseURI(v)
	case "language":
		_, err = syntax.ParseLanguage(v)
	case "tid":
		_, err = syntax.ParseTID(v)
	case "record-key":
		_, err = syntax.ParseRecordKey(v)
	}
	return err
}

func (w walker) integer(s lexicon.SchemaInteger, v any, path string) *ValidationError {
	n, ok := v.(json.Number)
	if !ok {
		return w.fail(path, WrongType, "want an integer, got %s", kindOf(v))
	}
	i, err := n.Int64()
	if err != nil {
		f, ferr := strconv.ParseFloat(string(n), 64)
		if ferr != nil || f != math.Trunc(f) || math.Abs(f) > atdata.MAX_SAFE_INTEGER {
			return w.fail(path, WrongType, "want an integer, got %s", short(string(n)))
		}
		i = int64(f)
	}
	if (s.Minimum != nil && i < int64(*s.Minimum)) || (s.Maximum != nil && i > int64(*s.Maximum)) {
		lo, hi := "-", "-"
		if s.Minimum != nil {
			lo = strconv.Itoa(*s.Minimum)
		}
		if s.Maximum != nil {
			hi = strconv.Itoa(*s.Maximum)
		}
		return w.fail(path, OutOfRange, "%d is outside %s..%s", i, lo, hi)
	}
	if s.Const != nil && i != int64(*s.Const) {
		return w.fail(path, NotAllowed, "is %d; must be %d", i, *s.Const)
	}
	if len(s.Enum) > 0 && !slices.Contains(s.Enum, int(i)) {
		return w.fail(path, NotAllowed, "is %d; not one of the allowed values", i)
	}
	return nil
}

func kindOf(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number:
		if strings.ContainsAny(string(x), ".eE") {
			return "a number " + short(string(x))
		}
		return "an integer"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	default:
		return fmt.Sprintf("%T", v)
	}
}

// short renders a value for an error message, cut to a readable length; a
// record may carry long strings and the message goes into conditions and logs.
func short(v any) string {
	s, ok := v.(string)
	if !ok {
		if v == nil {
			return "null"
		}
		return kindOf(v)
	}
	const max = 64
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut]) + "..."
	}
	return strconv.Quote(s)
}
