package main

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"
)

const sampleJUnit = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="6" disabled="3" errors="0" failures="1" time="42">
  <testsuite name="Kubernetes e2e suite" package="/e2e" tests="6" disabled="3" skipped="0" errors="0" failures="1" time="42">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.5"></testcase>
    <testcase name="[It] [sig-node] ConfigMap should be consumable via environment variable [NodeConformance] [Conformance]" classname="Kubernetes e2e suite" status="passed" time="8.1"></testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for the cluster [Conformance]" classname="Kubernetes e2e suite" status="failed" time="301">
      <failure message="Timed out after 300s.&#xA;more detail" type="failed">[FAILED] Timed out</failure>
    </testcase>
    <testcase name="[It] [sig-apps] Job should run a job to completion [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [sig-storage] CSI something [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0.2">
      <skipped message="skipped - Driver does not support this"></skipped>
    </testcase>
    <testcase name="[It] [sig-network] Services should serve endpoints [Conformance]" classname="Kubernetes e2e suite" status="interrupted" time="12">
      <error message="interrupted by Timeout" type="interrupted"></error>
    </testcase>
    <testcase name="[It] [sig-apps] CronJob should schedule multiple jobs concurrently [Conformance]" classname="Kubernetes e2e suite" status="failed" time="806">
      <failure message="A suite timeout occurred" type="failed"></failure>
    </testcase>
    <testcase name="[SynchronizedAfterSuite]" classname="Kubernetes e2e suite" status="failed" time="0.1">
      <failure message="cleanup failed" type="failed"></failure>
    </testcase>
  </testsuite>
</testsuites>`

func TestSummarize(t *testing.T) {
	s, err := summarize([]byte(sampleJUnit))
	if err != nil {
		t.Fatal(err)
	}
	if s.Passed != 1 || s.Failed != 2 || s.Skipped != 1 || s.Interrupted != 2 {
		t.Fatalf("got %d passed %d failed %d skipped %d interrupted, want 1 2 1 2", s.Passed, s.Failed, s.Skipped, s.Interrupted)
	}
	if s.Failures[0].Name != "[SynchronizedAfterSuite]" || s.Failures[1].Message != "Timed out after 300s." {
		t.Errorf("failures %+v", s.Failures)
	}
	if !strings.HasPrefix(s.Skips[0].Name, "[sig-storage] CSI") || !strings.Contains(s.Skips[0].Message, "Driver does not support") {
		t.Errorf("skips %+v", s.Skips)
	}
	if _, err := summarize([]byte("<testsuites><testsuite>")); err == nil {
		t.Error("a truncated report summarized without error")
	}
}

func TestFailureMessageBringsUpTheContainersMessage(t *testing.T) {
	c := junitCase{Status: "failed"}
	c.Failure = &struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	}{Message: "expected pod \"downward-api-1\" success: Told to stop trying after 4.0s.\npod failed with status:\n" +
		"    state:\n      terminated:\n        exitCode: 128\n        message: 'failed to create containerd task: failed to write \"125000\":\n          cpu.cfs_quota_us: invalid argument: unknown'\n        reason: StartError\n"}
	got := failureMessage(c)
	want := `expected pod "downward-api-1" success: Told to stop trying after 4.0s. (container: failed to create containerd task: failed to write "125000": cpu.cfs_quota_us: invalid argument: unknown)`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestRanOf(t *testing.T) {
	for _, c := range []struct {
		out        string
		ran, total int
		ok         bool
	}{
		{"Running Suite...\nRan 433 of 7210 Specs in 2.1 seconds\nSUCCESS!", 433, 7210, true},
		{"Ran 1 of 3 Specs\n...\nRan 5 of 9 Specs", 5, 9, true},
		{"flag provided but not defined: -ginkgo.foo", 0, 0, false},
	} {
		ran, total, ok := ranOf(c.out)
		if ran != c.ran || total != c.total || ok != c.ok {
			t.Errorf("ranOf(%q) = %d %d %v, want %d %d %v", c.out, ran, total, ok, c.ran, c.total, c.ok)
		}
	}
}

// Ginkgo's succinct output split at every byte boundary counts the same.
func TestProgressCountsAcrossChunks(t *testing.T) {
	out := "•••\n------------------------------\n• [FAILED] [12.3 seconds]\n[sig-x] spec\n•S•• [PANICKED] [1 s]\nx•"
	for size := 1; size <= len(out); size++ {
		var p progress
		for i := 0; i < len(out); i += size {
			end := min(i+size, len(out))
			_, _ = p.Write([]byte(out[i:end]))
		}
		p.Flush()
		if d, f := p.counts(); d != 8 || f != 2 {
			t.Fatalf("chunks of %d bytes: %d done %d failed, want 8 and 2", size, d, f)
		}
	}
}

func TestDefaultSkipsCompileAndSelect(t *testing.T) {
	re, err := regexp.Compile(skipRegex(defaultSkips, `\[sig-storage\]`))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"[sig-apps] Daemon set [Serial] should rollback without unnecessary restarts [Conformance]":                   true,
		"[sig-storage] EmptyDir volumes should support (root,0644,tmpfs) [LinuxOnly] [NodeConformance] [Conformance]": true,
		"[sig-node] ConfigMap should be consumable via environment variable [NodeConformance] [Conformance]":          false,
	} {
		if got := re.MatchString(name); got != want {
			t.Errorf("skip matches %q: %v, want %v", name, got, want)
		}
	}
	for _, s := range defaultSkips {
		if s.Group == "" || s.Reason == "" {
			t.Errorf("skip %q has no group or reason", s.Pattern)
		}
	}
}

func TestRepoListRemapsEveryRegistry(t *testing.T) {
	l := repoList("198.51.100.20:5000")
	for _, key := range []string{"promoterE2eRegistry", "gcRegistry", "gcEtcdRegistry", "invalidRegistry", "privateRegistry", "dockerLibraryRegistry", "sigStorageRegistry", "buildImageRegistry", "cloudProviderGcpRegistry"} {
		if !strings.Contains(l, key+": 198.51.100.20:5000/") {
			t.Errorf("%s is not remapped:\n%s", key, l)
		}
	}
	if strings.Contains(l, "k8s.io") || strings.Contains(l, "docker.io") || strings.Contains(l, "gcr.io") {
		t.Errorf("a registry name left:\n%s", l)
	}
}

// The same entries make the same layer digest on every run (the registry and the nodes'
// content stores then hold one copy per change).
func TestLayerIsReproducible(t *testing.T) {
	entries := func() []layerEntry {
		return []layerEntry{{Path: "usr/bin/x", Mode: 0o755, Data: []byte("x")}, {Path: "bin/sh", Link: "dash"}, {Path: "tmp", Mode: 0o1777, Dir: true}}
	}
	a, err := layerFromEntries(entries())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := layerFromEntries(entries())
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Errorf("digests differ: %s %s", da, db)
	}
}

func TestClashes(t *testing.T) {
	host := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("10.78.0.4/30"), netip.MustParsePrefix("127.0.0.0/8")}
	for _, c := range []struct {
		ours []string
		want int
	}{
		{[]string{hostIP, peerIP, registryIP}, 0},
		{[]string{"192.0.2.1", "192.0.2.2", "192.0.2.10"}, 3}, // this machine's LAN and gateway
		{[]string{"198.51.100.9", "10.78.0.6"}, 1},
	} {
		var ours []netip.Addr
		for _, a := range c.ours {
			ours = append(ours, netip.MustParseAddr(a))
		}
		if got := clashes(host, ours); len(got) != c.want {
			t.Errorf("clashes(%v) = %v, want %d", c.ours, got, c.want)
		}
	}
}
