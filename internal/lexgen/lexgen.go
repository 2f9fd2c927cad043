// Package lexgen writes plain Go types for atproto lexicons: structs with
// JSON tags, a typed union per union field, NSID and knownValues constants,
// and for records a $type check, a Decode function that validates against
// the lexicon catalog (package socialweb.computer/lexicons) and a Validate
// method. It is run by go generate through hack/lexgen; docs/lexicons.md says
// why we have our own generator and what the output looks like.
package lexgen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/format"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"github.com/bluesky-social/indigo/atproto/lexicon"
)

// Package maps every lexicon whose NSID starts with Prefix (a whole number of
// segments) to the Go package Name, written to <out>/<Name>.
type Package struct {
	Prefix string
	Name   string
}

// Config says where each lexicon goes.
type Config struct {
	// Packages, longest prefix wins. A lexicon without a package is an error.
	Packages []Package
	// ImportBase is the import path of the directory that holds the packages
	// (socialweb.computer/internal/atproto).
	ImportBase string
	// LexiconsImport is the import path of the package with ValidateJSON
	// (socialweb.computer/lexicons).
	LexiconsImport string
}

// Project is the configuration of socialweb.computer: which Go package under
// internal/atproto holds each lexicon family.
var Project = Config{
	Packages: []Package{
		{Prefix: "computer.socialweb", Name: "infra"},
		{Prefix: "computer.socialweb.k8s", Name: "cluster"},
		{Prefix: "com.publicdomainrelay.temp.cluster", Name: "cluster"},
		{Prefix: "com.publicdomainrelay.temp.market", Name: "market"},
		{Prefix: "com.atproto.repo", Name: "atrepo"},
	},
	ImportBase:     "socialweb.computer/internal/atproto",
	LexiconsImport: "socialweb.computer/lexicons",
}

// ReadDir reads every lexicon JSON file under dir, skipping testdata.
func ReadDir(dir string) ([]File, error) {
	var files []File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".json") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, File{Name: p, Data: b})
		return nil
	})
	return files, err
}

// File is one lexicon file: its name (for error messages) and its bytes.
type File struct {
	Name string
	Data []byte
}

type schemaFile struct {
	file   string
	id     string
	pkg    string
	prefix string
	defs   map[string]lexicon.SchemaDef
}

type typeRef struct {
	pkg  string
	name string
}

type gen struct {
	cfg     Config
	files   map[string]*schemaFile // by NSID
	types   map[string]typeRef     // canonical ref ("nsid" or "nsid#frag") -> Go type
	inUnion map[string]bool        // canonical refs that are members of some union
}

// Generate returns the Go source of each package, keyed by the path of the
// file relative to the output directory (infra/zz_generated.lexicons.go).
func Generate(files []File, cfg Config) (map[string][]byte, error) {
	g := &gen{cfg: cfg, files: map[string]*schemaFile{}, types: map[string]typeRef{}, inUnion: map[string]bool{}}
	for _, f := range files {
		var sf lexicon.SchemaFile
		if err := json.Unmarshal(f.Data, &sf); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		if err := sf.FinishParse(); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		if err := sf.CheckSchema(); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		if _, dup := g.files[sf.ID]; dup {
			return nil, fmt.Errorf("%s: %s is defined twice", f.Name, sf.ID)
		}
		p, ok := g.packageFor(sf.ID)
		if !ok {
			return nil, fmt.Errorf("%s: no package is configured for %s", f.Name, sf.ID)
		}
		g.files[sf.ID] = &schemaFile{file: f.Name, id: sf.ID, pkg: p.Name, prefix: p.Prefix, defs: sf.Defs}
	}
	for _, sf := range g.files {
		base := baseName(sf.id, sf.prefix)
		for frag := range sf.defs {
			name := base
			if frag != "main" {
				name += exported(frag)
			}
			g.types[canon(sf.id, frag)] = typeRef{pkg: sf.pkg, name: name}
		}
	}
	if err := g.checkNames(); err != nil {
		return nil, err
	}
	for _, sf := range g.sorted() {
		for _, frag := range sortedDefs(sf.defs) {
			g.findUnions(sf.id, sf.defs[frag].Inner)
		}
	}
	byPkg := map[string][]*schemaFile{}
	for _, sf := range g.sorted() {
		byPkg[sf.pkg] = append(byPkg[sf.pkg], sf)
	}
	out := map[string][]byte{}
	for pkg, sfs := range byPkg {
		src, err := g.pkgSource(pkg, sfs)
		if err != nil {
			return nil, err
		}
		out[path.Join(pkg, "zz_generated.lexicons.go")] = src
	}
	return out, nil
}

func (g *gen) packageFor(id string) (Package, bool) {
	var best Package
	found := false
	for _, p := range g.cfg.Packages {
		if (id == p.Prefix || strings.HasPrefix(id, p.Prefix+".")) && len(p.Prefix) > len(best.Prefix) {
			best, found = p, true
		}
	}
	return best, found
}

func (g *gen) sorted() []*schemaFile {
	ids := make([]string, 0, len(g.files))
	for id := range g.files {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := make([]*schemaFile, len(ids))
	for i, id := range ids {
		out[i] = g.files[id]
	}
	return out
}

func sortedDefs(defs map[string]lexicon.SchemaDef) []string {
	out := make([]string, 0, len(defs))
	for k := range defs {
		if k != "main" {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	if _, ok := defs["main"]; ok {
		out = append([]string{"main"}, out...)
	}
	return out
}

func sortedProps(m map[string]lexicon.SchemaDef) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkNames refuses two lexicon defs that would get the same Go name.
func (g *gen) checkNames() error {
	seen := map[typeRef]string{}
	refs := make([]string, 0, len(g.types))
	for r := range g.types {
		refs = append(refs, r)
	}
	sort.Strings(refs)
	for _, r := range refs {
		t := g.types[r]
		if other, ok := seen[t]; ok {
			return fmt.Errorf("%s and %s both map to %s.%s", other, r, t.pkg, t.name)
		}
		seen[t] = r
	}
	return nil
}

func (g *gen) defNamed(pkg, name string) (string, bool) {
	for r, t := range g.types {
		if t.pkg == pkg && t.name == name {
			return r, true
		}
	}
	return "", false
}

// canon is the canonical ref of a def: "nsid" for main, else "nsid#frag".
func canon(id, frag string) string {
	if frag == "main" {
		return id
	}
	return id + "#" + frag
}

// resolve turns a ref as written in the lexicon of base into its canonical form.
func resolve(base, ref string) string {
	if strings.HasPrefix(ref, "#") {
		ref = base + ref
	}
	return strings.TrimSuffix(ref, "#main")
}

func (g *gen) findUnions(base string, def any) {
	switch s := def.(type) {
	case lexicon.SchemaRecord:
		g.findUnions(base, s.Record)
	case lexicon.SchemaObject:
		for _, k := range sortedProps(s.Properties) {
			g.findUnions(base, s.Properties[k].Inner)
		}
	case lexicon.SchemaArray:
		g.findUnions(base, s.Items.Inner)
	case lexicon.SchemaUnion:
		for _, r := range s.Refs {
			g.inUnion[resolve(base, r)] = true
		}
	case lexicon.SchemaQuery:
		g.findBody(base, s.Output)
	case lexicon.SchemaProcedure:
		g.findBody(base, s.Input)
		g.findBody(base, s.Output)
	case lexicon.SchemaSubscription:
		g.findUnions(base, s.Message.Schema)
	}
}

func (g *gen) findBody(base string, b *lexicon.SchemaBody) {
	if b != nil && b.Schema != nil {
		g.findUnions(base, b.Schema.Inner)
	}
}

// --- naming ---

var initialisms = map[string]bool{
	"api": true, "cid": true, "cpu": true, "did": true, "dns": true, "http": true, "id": true,
	"ip": true, "json": true, "nsid": true, "rfp": true, "ssh": true, "tid": true, "ttl": true,
	"uid": true, "uri": true, "url": true, "vm": true,
}

// words splits "endpointUrl", "user_data" or "only-me" into words.
func words(s string) []string {
	var out []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			out = append(out, string(cur))
			cur = cur[:0]
		}
	}
	rs := []rune(s)
	for i, r := range rs {
		switch {
		case !unicode.IsLetter(r) && !unicode.IsDigit(r):
			flush()
		case unicode.IsUpper(r) && i > 0 && (unicode.IsLower(rs[i-1]) || unicode.IsDigit(rs[i-1])):
			flush()
			cur = append(cur, r)
		default:
			cur = append(cur, r)
		}
	}
	flush()
	return out
}

// exported turns a lexicon name into an exported Go identifier.
func exported(s string) string {
	var b strings.Builder
	for _, w := range words(s) {
		lw := strings.ToLower(w)
		if initialisms[lw] {
			b.WriteString(strings.ToUpper(lw))
			continue
		}
		r := []rune(w)
		r[0] = unicode.ToUpper(r[0])
		b.WriteString(string(r))
	}
	out := b.String()
	if out == "" || !unicode.IsLetter([]rune(out)[0]) {
		out = "X" + out
	}
	return out
}

// baseName is the Go name of an NSID's main def: its segments after the
// package prefix (com.publicdomainrelay.temp.market.bids.free -> BidsFree).
func baseName(id, prefix string) string {
	rest := strings.TrimPrefix(strings.TrimPrefix(id, prefix), ".")
	if rest == "" {
		rest = id[strings.LastIndexByte(id, '.')+1:]
	}
	var b strings.Builder
	for _, seg := range strings.Split(rest, ".") {
		b.WriteString(exported(seg))
	}
	return b.String()
}

// --- output ---

type pkgWriter struct {
	g       *gen
	pkg     string
	body    bytes.Buffer
	consts  bytes.Buffer
	imports map[string]string // path -> name ("" for default)
	unions  []unionType
}

type unionType struct {
	name   string
	where  string
	refs   []string // canonical
	closed bool
}

func (w *pkgWriter) p(format string, args ...any) {
	fmt.Fprintf(&w.body, format, args...)
}

func (w *pkgWriter) use(imp string) { w.imports[imp] = "" }

// goType returns the Go name of a canonical ref, qualified when it lives in
// another package.
func (w *pkgWriter) goType(ref string) (string, error) {
	t, ok := w.g.types[ref]
	if !ok {
		return "", fmt.Errorf("ref %s does not resolve to a lexicon def", ref)
	}
	if t.pkg == w.pkg {
		return t.name, nil
	}
	w.use(w.g.cfg.ImportBase + "/" + t.pkg)
	return t.pkg + "." + t.name, nil
}

func (g *gen) pkgSource(pkg string, sfs []*schemaFile) ([]byte, error) {
	w := &pkgWriter{g: g, pkg: pkg, imports: map[string]string{}}
	var nsids []string
	for _, sf := range sfs {
		nsids = append(nsids, sf.id)
		for _, frag := range sortedDefs(sf.defs) {
			if err := w.def(sf, frag, sf.defs[frag].Inner); err != nil {
				return nil, fmt.Errorf("%s#%s: %w", sf.id, frag, err)
			}
		}
	}
	for i := 0; i < len(w.unions); i++ {
		if t, ok := w.g.defNamed(pkg, w.unions[i].name); ok {
			return nil, fmt.Errorf("the union type %s.%s has the name of the def %s", pkg, w.unions[i].name, t)
		}
		if err := w.union(w.unions[i]); err != nil {
			return nil, err
		}
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, "// Code generated by hack/lexgen from lexicons/. DO NOT EDIT.\n\n")
	fmt.Fprintf(&out, "// Package %s holds the Go types of these lexicons:\n//\n", pkg)
	for _, id := range nsids {
		fmt.Fprintf(&out, "//   - %s\n", id)
	}
	fmt.Fprintf(&out, "package %s\n\n", pkg)
	if len(w.imports) > 0 {
		imps := make([]string, 0, len(w.imports))
		for imp := range w.imports {
			imps = append(imps, imp)
		}
		sort.Slice(imps, func(i, j int) bool {
			si, sj := !strings.Contains(imps[i], "."), !strings.Contains(imps[j], ".")
			if si != sj {
				return si
			}
			return imps[i] < imps[j]
		})
		out.WriteString("import (\n")
		for i, imp := range imps {
			if i > 0 && !strings.Contains(imps[i-1], ".") && strings.Contains(imp, ".") {
				out.WriteString("\n")
			}
			fmt.Fprintf(&out, "\t%q\n", imp)
		}
		out.WriteString(")\n\n")
	}
	if w.consts.Len() > 0 {
		out.WriteString("const (\n")
		out.Write(w.consts.Bytes())
		out.WriteString(")\n\n")
	}
	out.Write(w.body.Bytes())
	if w.needsTypeHelper() {
		out.WriteString(typeHelper)
	}
	src, err := format.Source(out.Bytes())
	if err != nil {
		return nil, fmt.Errorf("package %s: gofmt: %w\n%s", pkg, err, out.Bytes())
	}
	return src, nil
}

func (w *pkgWriter) needsTypeHelper() bool {
	_, ok := w.imports["encoding/json"]
	return ok && strings.Contains(w.body.String(), "lexTypeOf(")
}

const typeHelper = `
// lexTypeOf returns the $type of a JSON object, "" when it has none.
func lexTypeOf(b []byte) (string, error) {
	var v struct {
		Type *string ` + "`json:\"$type\"`" + `
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return "", err
	}
	if v.Type == nil {
		return "", nil
	}
	return *v.Type, nil
}
`

func doc(desc *string) string {
	if desc == nil || *desc == "" {
		return ""
	}
	return *desc
}

func (w *pkgWriter) comment(indent, text string) {
	if text == "" {
		return
	}
	for _, line := range wrap(text, 76) {
		w.p("%s// %s\n", indent, line)
	}
}

func wrap(s string, width int) []string {
	var out []string
	var line string
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			out = append(out, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		out = append(out, line)
	}
	return out
}

func (w *pkgWriter) def(sf *schemaFile, frag string, def any) error {
	ref := canon(sf.id, frag)
	name := w.g.types[ref].name
	switch s := def.(type) {
	case lexicon.SchemaRecord:
		fmt.Fprintf(&w.consts, "\t// %sNSID is the collection of %s records.\n\t%sNSID = %q\n", name, name, name, sf.id)
		w.comment("", fmt.Sprintf("%s is a %s record (key %s). %s", name, sf.id, s.Key, doc(s.Description)))
		if err := w.object(sf.id, name, s.Record); err != nil {
			return err
		}
		w.record(name)
	case lexicon.SchemaObject:
		if frag == "main" {
			fmt.Fprintf(&w.consts, "\t// %sNSID is the NSID of %s.\n\t%sNSID = %q\n", name, name, name, sf.id)
		}
		w.comment("", fmt.Sprintf("%s is %s. %s", name, ref, doc(s.Description)))
		if err := w.object(sf.id, name, s); err != nil {
			return err
		}
		if w.g.inUnion[ref] {
			w.typed(name, ref)
		}
	case lexicon.SchemaQuery:
		fmt.Fprintf(&w.consts, "\t// %sNSID is the NSID of the %s query.\n\t%sNSID = %q\n", name, name, name, sf.id)
		if err := w.params(sf.id, name, s.Parameters, doc(s.Description)); err != nil {
			return err
		}
		return w.body2(sf.id, name+"Output", s.Output, "the output of "+sf.id)
	case lexicon.SchemaProcedure:
		fmt.Fprintf(&w.consts, "\t// %sNSID is the NSID of the %s procedure.\n\t%sNSID = %q\n", name, name, name, sf.id)
		if err := w.params(sf.id, name, s.Parameters, ""); err != nil {
			return err
		}
		if err := w.body2(sf.id, name+"Input", s.Input, "the input of "+sf.id+". "+doc(s.Description)); err != nil {
			return err
		}
		return w.body2(sf.id, name+"Output", s.Output, "the output of "+sf.id)
	case lexicon.SchemaSubscription:
		fmt.Fprintf(&w.consts, "\t// %sNSID is the NSID of the %s subscription.\n\t%sNSID = %q\n", name, name, name, sf.id)
		if err := w.params(sf.id, name, s.Parameters, doc(s.Description)); err != nil {
			return err
		}
		w.addUnion(name+"Message", "the messages of "+sf.id, sf.id, s.Message.Schema)
	case lexicon.SchemaString:
		// A named string def: a Go string type with its known values.
		w.comment("", fmt.Sprintf("%s is %s. %s", name, ref, doc(s.Description)))
		w.p("type %s = string\n\n", name)
		w.knownValues(name, s)
	case lexicon.SchemaToken:
		fmt.Fprintf(&w.consts, "\t// %s is the token %s.\n\t%s = %q\n", name, ref, name, ref)
	default:
		return fmt.Errorf("lexgen does not support a %T def", def)
	}
	return nil
}

func (w *pkgWriter) params(base, name string, p *lexicon.SchemaParams, desc string) error {
	if p == nil || len(p.Properties) == 0 {
		return nil
	}
	obj := lexicon.SchemaObject{Type: "object", Properties: p.Properties, Required: p.Required}
	w.comment("", fmt.Sprintf("%sParams are the parameters of %s. %s", name, base, desc))
	return w.object(base, name+"Params", obj)
}

func (w *pkgWriter) body2(base, name string, b *lexicon.SchemaBody, what string) error {
	if b == nil || b.Schema == nil {
		return nil
	}
	switch s := b.Schema.Inner.(type) {
	case lexicon.SchemaObject:
		w.comment("", fmt.Sprintf("%s is %s (%s).", name, what, b.Encoding))
		return w.object(base, name, s)
	case lexicon.SchemaRef:
		t, err := w.goType(resolve(base, s.Ref))
		if err != nil {
			return err
		}
		w.comment("", fmt.Sprintf("%s is %s (%s).", name, what, b.Encoding))
		w.p("type %s = %s\n\n", name, t)
	case lexicon.SchemaUnion:
		w.addUnion(name, what, base, s)
	}
	return nil
}

func (w *pkgWriter) addUnion(name, where, base string, s lexicon.SchemaUnion) {
	refs := make([]string, len(s.Refs))
	for i, r := range s.Refs {
		refs[i] = resolve(base, r)
	}
	w.unions = append(w.unions, unionType{name: name, where: where, refs: refs, closed: s.Closed != nil && *s.Closed})
}

func (w *pkgWriter) object(base, name string, s lexicon.SchemaObject) error {
	required := map[string]bool{}
	for _, r := range s.Required {
		required[r] = true
	}
	if len(s.Nullable) > 0 {
		return fmt.Errorf("%s: nullable fields are not supported", name)
	}
	w.p("type %s struct {\n", name)
	for _, k := range sortedProps(s.Properties) {
		field := exported(k)
		def := s.Properties[k].Inner
		typ, kind, err := w.fieldType(base, name+field, def)
		if err != nil {
			return fmt.Errorf("%s.%s: %w", name, k, err)
		}
		tag := k
		switch {
		case required[k]:
		case kind == kindSlice:
			tag += ",omitzero"
		default:
			if kind == kindValue {
				typ = "*" + typ
			}
			tag += ",omitempty"
		}
		w.comment("\t", fieldDoc(def, required[k]))
		w.p("\t%s %s `json:%q`\n", field, typ, tag)
	}
	w.p("}\n\n")
	for _, k := range sortedProps(s.Properties) {
		switch d := s.Properties[k].Inner.(type) {
		case lexicon.SchemaString:
			w.knownValues(name+exported(k), d)
		case lexicon.SchemaInteger:
			if d.Default != nil {
				fmt.Fprintf(&w.consts, "\t%sDefault = %d\n", name+exported(k), *d.Default)
			}
		case lexicon.SchemaBoolean:
			if d.Default != nil {
				fmt.Fprintf(&w.consts, "\t%sDefault = %v\n", name+exported(k), *d.Default)
			}
		}
	}
	return nil
}

func (w *pkgWriter) knownValues(prefix string, s lexicon.SchemaString) {
	vals := append(append([]string{}, s.KnownValues...), s.Enum...)
	for _, v := range vals {
		fmt.Fprintf(&w.consts, "\t%s%s = %q\n", prefix, exported(v), v)
	}
	if s.Default != nil {
		fmt.Fprintf(&w.consts, "\t%sDefault = %q\n", prefix, *s.Default)
	}
}

func fieldDoc(def any, required bool) string {
	var parts []string
	var desc *string
	switch s := def.(type) {
	case lexicon.SchemaString:
		desc = s.Description
		if s.Format != nil {
			parts = append(parts, "format "+*s.Format)
		}
		if s.MaxLength != nil {
			parts = append(parts, "at most "+strconv.Itoa(*s.MaxLength)+" bytes")
		}
		if s.MaxGraphemes != nil {
			parts = append(parts, "at most "+strconv.Itoa(*s.MaxGraphemes)+" graphemes")
		}
		if len(s.KnownValues) > 0 {
			parts = append(parts, "known values "+strings.Join(s.KnownValues, ", "))
		}
	case lexicon.SchemaInteger:
		desc = s.Description
		if s.Minimum != nil {
			parts = append(parts, "minimum "+strconv.Itoa(*s.Minimum))
		}
		if s.Maximum != nil {
			parts = append(parts, "maximum "+strconv.Itoa(*s.Maximum))
		}
	case lexicon.SchemaArray:
		desc = s.Description
		if s.MaxLength != nil {
			parts = append(parts, "at most "+strconv.Itoa(*s.MaxLength)+" items")
		}
	case lexicon.SchemaRef:
		desc = s.Description
	case lexicon.SchemaUnion:
		desc = s.Description
	case lexicon.SchemaUnknown:
		desc = s.Description
		parts = append(parts, "a JSON object")
	case lexicon.SchemaBoolean:
		desc = s.Description
	}
	if required {
		parts = append([]string{"Required"}, parts...)
	}
	out := doc(desc)
	if len(parts) > 0 {
		if out != "" {
			out += " "
		}
		out += "(" + strings.Join(parts, "; ") + ")"
	}
	return out
}

type fieldKind int

const (
	kindValue fieldKind = iota // optional: pointer
	kindSlice                  // optional: omitzero
	kindRaw                    // optional: omitempty, no pointer
)

func (w *pkgWriter) fieldType(base, unionName string, def any) (string, fieldKind, error) {
	switch s := def.(type) {
	case lexicon.SchemaString:
		return "string", kindValue, nil
	case lexicon.SchemaInteger:
		return "int64", kindValue, nil
	case lexicon.SchemaBoolean:
		return "bool", kindValue, nil
	case lexicon.SchemaUnknown:
		w.use("encoding/json")
		return "json.RawMessage", kindRaw, nil
	case lexicon.SchemaRef:
		t, err := w.goType(resolve(base, s.Ref))
		return t, kindValue, err
	case lexicon.SchemaUnion:
		w.addUnion(unionName, "the union in "+unionName, base, s)
		return unionName, kindValue, nil
	case lexicon.SchemaArray:
		if _, ok := s.Items.Inner.(lexicon.SchemaArray); ok {
			return "", 0, fmt.Errorf("arrays of arrays are not supported")
		}
		elem, _, err := w.fieldType(base, unionName, s.Items.Inner)
		if err != nil {
			return "", 0, err
		}
		return "[]" + elem, kindSlice, nil
	case lexicon.SchemaObject:
		return "", 0, fmt.Errorf("lexgen does not support an inline object; use a named def and a ref")
	default:
		return "", 0, fmt.Errorf("lexgen does not support a %T field", def)
	}
}

// record writes the $type handling and the Decode and Validate functions of a record type.
func (w *pkgWriter) record(name string) {
	w.use("encoding/json")
	w.use("fmt")
	w.use(w.g.cfg.LexiconsImport)
	lex := path.Base(w.g.cfg.LexiconsImport)
	w.p(`// MarshalJSON writes the record with its $type.
func (r %[1]s) MarshalJSON() ([]byte, error) {
	type plain %[1]s
	return json.Marshal(struct {
		Type string `+"`json:\"$type\"`"+`
		plain
	}{%[1]sNSID, plain(r)})
}

// UnmarshalJSON reads the record and requires its $type to be %[1]sNSID.
func (r *%[1]s) UnmarshalJSON(b []byte) error {
	type plain %[1]s
	var v struct {
		Type *string `+"`json:\"$type\"`"+`
		plain
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if v.Type == nil || *v.Type != %[1]sNSID {
		return fmt.Errorf("$type must be %%q", %[1]sNSID)
	}
	*r = %[1]s(v.plain)
	return nil
}

// Decode%[1]s validates b against the lexicon and decodes it. A record that
// does not match returns a *lexicons.ValidationError that says why.
func Decode%[1]s(b []byte) (*%[1]s, error) {
	if err := %[2]s.ValidateJSON(%[1]sNSID, b); err != nil {
		return nil, err
	}
	var r %[1]s
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Validate checks the record against its lexicon before it is written.
func (r *%[1]s) Validate() error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return %[2]s.ValidateJSON(%[1]sNSID, b)
}

`, name, lex)
}

// typed writes the $type handling of an object that is a member of a union:
// it is written with its $type, and read with its $type or without one.
func (w *pkgWriter) typed(name, ref string) {
	w.use("encoding/json")
	w.use("fmt")
	w.p(`// LexiconType is the $type of %[1]s in a union.
func (%[1]s) LexiconType() string { return %[2]q }

// MarshalJSON writes %[1]s with its $type.
func (o %[1]s) MarshalJSON() ([]byte, error) {
	type plain %[1]s
	return json.Marshal(struct {
		Type string `+"`json:\"$type\"`"+`
		plain
	}{%[2]q, plain(o)})
}

// UnmarshalJSON reads %[1]s; a $type, when present, must be %[2]q.
func (o *%[1]s) UnmarshalJSON(b []byte) error {
	type plain %[1]s
	var v struct {
		Type *string `+"`json:\"$type\"`"+`
		plain
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if v.Type != nil && *v.Type != %[2]q && *v.Type != %[2]q+"#main" {
		return fmt.Errorf("$type is %%q, want %%q", *v.Type, %[2]q)
	}
	*o = %[1]s(v.plain)
	return nil
}

`, name, ref)
}

func (w *pkgWriter) union(u unionType) error {
	w.use("encoding/json")
	w.use("fmt")
	type member struct{ field, typ, ref string }
	var ms []member
	for _, r := range u.refs {
		t, err := w.goType(r)
		if err != nil {
			return fmt.Errorf("%s: %w", u.name, err)
		}
		tr := w.g.types[r]
		field := tr.name
		ms = append(ms, member{field: field, typ: t, ref: r})
	}
	var names []string
	for _, m := range ms {
		names = append(names, m.field)
	}
	kind := "an open union: a member of another $type is kept in Other"
	if u.closed {
		kind = "a closed union"
	}
	w.comment("", fmt.Sprintf("%s is %s: exactly one of %s is set; %s.", u.name, u.where, strings.Join(names, ", "), kind))
	w.p("type %s struct {\n", u.name)
	for _, m := range ms {
		w.p("\t%s *%s\n", m.field, m.typ)
	}
	if !u.closed {
		w.p("\t// Other is a member of a $type this package does not know, as read.\n\tOther json.RawMessage\n")
	}
	w.p("}\n\n")

	w.p("// Type returns the $type of the member that is set, \"\" when none is.\nfunc (u %s) Type() string {\n\tswitch {\n", u.name)
	for _, m := range ms {
		w.p("\tcase u.%s != nil:\n\t\treturn %q\n", m.field, m.ref)
	}
	if !u.closed {
		w.p("\tcase u.Other != nil:\n\t\tt, _ := lexTypeOf(u.Other)\n\t\treturn t\n")
	}
	w.p("\t}\n\treturn \"\"\n}\n\n")

	w.p("// MarshalJSON writes the member that is set, with its $type.\nfunc (u %s) MarshalJSON() ([]byte, error) {\n\tswitch {\n", u.name)
	for _, m := range ms {
		w.p("\tcase u.%s != nil:\n\t\treturn json.Marshal(u.%s)\n", m.field, m.field)
	}
	if !u.closed {
		w.p("\tcase u.Other != nil:\n\t\treturn u.Other, nil\n")
	}
	w.p("\t}\n\treturn nil, fmt.Errorf(\"%s: no member is set\")\n}\n\n", u.name)

	w.p("// UnmarshalJSON reads a member by its $type.\nfunc (u *%s) UnmarshalJSON(b []byte) error {\n", u.name)
	w.p("\tt, err := lexTypeOf(b)\n\tif err != nil {\n\t\treturn err\n\t}\n\t*u = %s{}\n\tswitch t {\n", u.name)
	w.p("\tcase \"\":\n\t\treturn fmt.Errorf(\"%s: $type is missing\")\n", u.name)
	for _, m := range ms {
		alt := ""
		if !strings.Contains(m.ref, "#") {
			alt = fmt.Sprintf(", %q", m.ref+"#main")
		}
		w.p("\tcase %q%s:\n\t\tu.%s = new(%s)\n\t\treturn json.Unmarshal(b, u.%s)\n", m.ref, alt, m.field, m.typ, m.field)
	}
	if u.closed {
		w.p("\tdefault:\n\t\treturn fmt.Errorf(\"%s: $type %%q is not a member of this closed union\", t)\n\t}\n}\n\n", u.name)
	} else {
		w.p("\tdefault:\n\t\tu.Other = append(json.RawMessage(nil), b...)\n\t\treturn nil\n\t}\n}\n\n")
	}
	return nil
}
