package main

import (
	"encoding/xml"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// repoList is the KUBE_TEST_REPO_LIST file: every registry the suite names, remapped to a
// path under the harness's registry. The invalid and private registries are remapped too, to
// paths the registry does not serve, so a spec that expects a failed pull gets one without a
// name ever being resolved.
func repoList(registry string) string {
	keys := []struct{ key, path string }{
		{"promoterE2eRegistry", "e2e-test-images"},
		{"buildImageRegistry", "build-image"},
		{"invalidRegistry", "invalid"},
		{"gcEtcdRegistry", "k8s"},
		{"gcRegistry", "k8s"},
		{"sigStorageRegistry", "sig-storage"},
		{"privateRegistry", "private"},
		{"dockerLibraryRegistry", "library"},
		{"cloudProviderGcpRegistry", "cloud-provider-gcp"},
	}
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s: %s/%s\n", k.key, registry, k.path)
	}
	return b.String()
}

// hostsTOML is containerd's hosts.toml for a registry served over plain HTTP.
func hostsTOML(registry string) string {
	return fmt.Sprintf("server = \"http://%[1]s\"\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", registry)
}

// skipReason is a [Conformance] spec (or group) left out of a run, with why.
type skipReason struct {
	// Pattern is a regular expression on the spec's full text.
	Pattern string
	Group   string
	Reason  string
}

// defaultSkips are left out of every run unless --no-default-skips. Each names what a rented
// node of a tenant cluster does not offer, or what the harness does not build yet.
var defaultSkips = []skipReason{
	{`\[Serial\]|\[Disruptive\]`, "harness", "[Serial] and [Disruptive] specs need the whole cluster to themselves; the parallel run leaves them out (run them with --focus '\\[Serial\\].*\\[Conformance\\]' --procs 1)"},
	{`HostPort validates that there is no conflict between pods with same hostPort but different hostIP and protocol`, "pod security", "hostPort is refused by the Pod Security floor (baseline) every tenant cluster enforces"},
	{`StatefulSet Basic StatefulSet functionality .*Should recreate evicted statefulset`, "pod security", "its conflicting pod takes a hostPort, which the Pod Security floor (baseline) refuses"},
	{`Job should allow to use a pod failure policy to ignore failure matching on DisruptionTarget condition`, "pod security", "its pods run privileged containers, which no tenant cluster admits (--allow-privileged=false)"},
	{`ImageVolume should succeed with pod and pull policy of Always`, "nodes", "Debian's containerd 1.6 mounts no image volumes (containerd 2.1 does): the pod never starts ('failed to generate spec: failed to mkdir \"\"') and the spec waits out 5 minutes"},
	{`Networking Granular Checks: Pods should function for node-pod communication`, "pod security", "its test pod runs with hostNetwork, which the Pod Security floor (baseline) refuses"},
}

// skipRegex joins the skip patterns and the caller's own into one ginkgo --skip value.
func skipRegex(skips []skipReason, extra string) string {
	var parts []string
	for _, s := range skips {
		parts = append(parts, "(?:"+s.Pattern+")")
	}
	if extra != "" {
		parts = append(parts, "(?:"+extra+")")
	}
	return strings.Join(parts, "|")
}

// junitSuites is ginkgo's JUnit report: one testsuite per run (merged across processes).
type junitSuites struct {
	Suites []struct {
		Cases []junitCase `xml:"testcase"`
	} `xml:"testsuite"`
}

type junitCase struct {
	Name    string  `xml:"name,attr"`
	Status  string  `xml:"status,attr"`
	Time    float64 `xml:"time,attr"`
	Failure *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"failure"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
}

// specResult is one spec's outcome.
type specResult struct {
	Name    string
	State   string // passed, failed, skipped
	Seconds float64
	Message string
}

// summary is the figures a run prints.
type summary struct {
	Passed, Failed, Skipped int
	// Interrupted specs were cut short by the suite's timeout or an abort: not a verdict.
	Interrupted int
	Failures    []specResult
	Skips       []specResult
}

// summarize reads a JUnit report into per-spec results. Setup nodes (BeforeSuite and the
// like) are not specs; specs the focus or skip filtered out never ran and are not counted;
// a spec that ran and called Skip is counted skipped.
func summarize(report []byte) (summary, error) {
	var js junitSuites
	if err := xml.Unmarshal(report, &js); err != nil {
		return summary{}, fmt.Errorf("junit report: %w", err)
	}
	var s summary
	for _, suite := range js.Suites {
		for _, c := range suite.Cases {
			if !strings.HasPrefix(c.Name, "[It] ") {
				if c.Status == "failed" || c.Failure != nil {
					// A failed suite setup fails every spec after it: count it.
					s.Failed++
					s.Failures = append(s.Failures, specResult{Name: c.Name, State: "failed", Seconds: c.Time, Message: failureMessage(c)})
				}
				continue
			}
			r := specResult{Name: strings.TrimPrefix(c.Name, "[It] "), Seconds: c.Time}
			switch {
			case c.Status == "passed":
				r.State = "passed"
				s.Passed++
			case c.Status == "skipped" || c.Status == "pending" || c.Skipped != nil:
				if c.Skipped != nil && filteredOut(c.Skipped.Message) {
					continue
				}
				r.State = "skipped"
				if c.Skipped != nil {
					r.Message = c.Skipped.Message
				}
				s.Skipped++
				s.Skips = append(s.Skips, r)
			case c.Status == "interrupted" || c.Status == "aborted" ||
				c.Failure != nil && strings.HasPrefix(c.Failure.Message, "A suite timeout occurred"):
				s.Interrupted++
			default: // failed, panicked, timedout
				r.State = "failed"
				r.Message = failureMessage(c)
				s.Failed++
				s.Failures = append(s.Failures, r)
			}
		}
	}
	sort.Slice(s.Failures, func(i, j int) bool { return s.Failures[i].Name < s.Failures[j].Name })
	sort.Slice(s.Skips, func(i, j int) bool { return s.Skips[i].Name < s.Skips[j].Name })
	return s, nil
}

// filteredOut says a skipped testcase never ran: ginkgo writes "skipped" with no reason for a
// spec its focus or skip left out, and "skipped - REASON" for one that called Skip.
func filteredOut(msg string) bool {
	return strings.TrimSpace(msg) == "skipped" || strings.TrimSpace(msg) == ""
}

func failureMessage(c junitCase) string {
	if c.Failure == nil {
		return c.Status
	}
	m := strings.TrimSpace(c.Failure.Message)
	if m == "" {
		m = strings.TrimSpace(c.Failure.Text)
	}
	first, rest, _ := strings.Cut(m, "\n")
	if len(first) > 300 {
		first = first[:300] + "..."
	}
	// A pod's failure is in its container's termination message, deep in the dumped
	// status: bring it to the line (StartError's runc error, say).
	if cm := containerMessage.FindStringSubmatch(rest); cm != nil {
		msg := strings.Join(strings.Fields(cm[1]), " ")
		if len(msg) > 200 {
			// runc's errors wrap outside in: the end is the specific part.
			msg = "..." + msg[len(msg)-200:]
		}
		first += " (container: " + msg + ")"
	}
	return first
}

// containerMessage is a terminated container's message in a dumped v1.PodStatus (YAML, its
// value quoted and folded over lines).
var containerMessage = regexp.MustCompile(`(?s)terminated:.*?message: '(.*?)'\n`)

var ranRe = regexp.MustCompile(`Ran (\d+) of (\d+) Specs`)

// ranOf reads ginkgo's "Ran N of M Specs" line (a dry run's says how many specs a focus and
// skip select).
func ranOf(out string) (ran, total int, ok bool) {
	m := ranRe.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return 0, 0, false
	}
	last := m[len(m)-1]
	ran, _ = strconv.Atoi(last[1])
	total, _ = strconv.Atoi(last[2])
	return ran, total, true
}

// progress counts finished specs in ginkgo's default (succinct) output as it streams: a
// "•" for every spec that ran, followed by " [FAILED]" (or PANICKED, TIMEDOUT) when it
// failed.
type progress struct {
	mu           sync.Mutex
	Done, Failed int
	tail         string
}

// counts is what has been counted so far.
func (p *progress) counts() (done, failed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.Done, p.Failed
}

var failedMark = regexp.MustCompile(`• \[(FAILED|PANICKED|TIMEDOUT|INTERRUPTED)\]`)

// Write takes the next chunk of output.
func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	text := p.tail + string(b)
	// Keep from a "•" too recent to tell whether its spec failed, else the last two bytes
	// (the start of a "•" split between writes).
	keep := max(0, len(text)-2)
	if i := strings.LastIndex(text, "•"); i >= 0 && len(text)-i <= 32 {
		keep = i
	}
	p.count(text[:keep])
	p.tail = text[keep:]
	return len(b), nil
}

// Flush counts what is left at the end of the output.
func (p *progress) Flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.count(p.tail)
	p.tail = ""
}

func (p *progress) count(s string) {
	p.Done += strings.Count(s, "•")
	p.Failed += len(failedMark.FindAllString(s, -1))
}
