package hostcheck

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// Used says whether the configuration runs anything of area.
func Used(area string, c Config) bool {
	switch area {
	case AreaDeno:
		return c.Deno
	case AreaNodes, AreaInput, AreaTenants:
		return c.Tenants
	case AreaVM, AreaVMNodes:
		return c.Tenants && c.flavour() == FlavourVM
	}
	return false
}

// Summary is one line per area: "deno guests: ready", or what is missing and the command
// that installs it, and whether the configuration uses the area at all.
func Summary(rows []Row, c Config) []string {
	var lines []string
	for _, area := range Areas {
		var lacks, optional []string
		seen := false
		for _, r := range rows {
			if r.Area != area {
				continue
			}
			seen = true
			if r.Status == Holds {
				continue
			}
			if r.Optional {
				optional = append(optional, r.Requirement)
				continue
			}
			what := r.Requirement
			if r.Fix != "" {
				what += " (" + r.Fix + ")"
			}
			verb := "missing "
			if r.Status == MustBePassedIn {
				verb = "pass in "
			}
			lacks = append(lacks, verb+what)
		}
		if !seen {
			continue
		}
		line := area + ": ready"
		if len(lacks) > 0 {
			line = area + ": " + strings.Join(lacks, "; ")
		}
		if area == AreaInput && len(optional) > 0 {
			line += "; optional: " + strings.Join(optional, ", ")
		}
		if !Used(area, c) {
			line += " (not used by this configuration)"
		}
		lines = append(lines, line)
	}
	return lines
}

// Print writes the host line, every row grouped by area and aligned (status, whether the
// configuration needs it, requirement, detail -> fix), then the summary.
func Print(w io.Writer, h Host, c Config, rows []Row) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "host: kernel %s, euid %d, cgroups %s, /dev/kvm %s\n", or(h.Kernel, "unknown"), h.EUID, or(h.Cgroups.Layout, "unknown"), kvmWord(h))
	reqWidth := 0
	for _, r := range rows {
		reqWidth = max(reqWidth, len(r.Requirement))
	}
	for _, area := range Areas {
		first := true
		for _, r := range rows {
			if r.Area != area {
				continue
			}
			if first {
				used := ""
				if !Used(area, c) {
					used = " (not used by this configuration)"
				}
				fmt.Fprintf(bw, "\n%s%s\n", area, used)
				first = false
			}
			detail := r.Detail
			if r.Fix != "" {
				detail += " -> " + r.Fix
			}
			fmt.Fprintf(bw, "  %-*s  %-8s  %-*s  %s\n", len(MustBePassedIn), r.Status, need(r), reqWidth, r.Requirement, detail)
		}
	}
	fmt.Fprintln(bw)
	for _, l := range Summary(rows, c) {
		fmt.Fprintln(bw, l)
	}
	return bw.Flush()
}

// need is the row's second column: needed by this configuration, optional, or unused.
func need(r Row) string {
	switch {
	case r.Optional:
		return "optional"
	case !r.Needed:
		return "unused"
	}
	return "needed"
}

func kvmWord(h Host) string {
	if h.KVM.Usable {
		return "usable"
	}
	return "not usable (tcg)"
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
