package image

import (
	"bytes"
	"debug/elf"
	"fmt"
	"strings"
)

// NodeModuleOrderFile is the initramfs file that lists, one per line, the modules a
// vm-flavoured node loads, each after those it depends on: NodeModules and their
// dependencies, less what the image's init loads already (NetModules and theirs).
const NodeModuleOrderFile = "lib/modules/node.order"

// moduleDepends reads the depends= field of a kernel module's .modinfo section: the
// modules that must be loaded before it (a kernel package carries no modules.dep; depmod
// writes that at install).
func moduleDepends(ko []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return nil, fmt.Errorf("not a kernel module: %w", err)
	}
	s := f.Section(".modinfo")
	if s == nil {
		return nil, fmt.Errorf("no .modinfo section")
	}
	data, err := s.Data()
	if err != nil {
		return nil, fmt.Errorf(".modinfo: %w", err)
	}
	for _, field := range bytes.Split(data, []byte{0}) {
		v, ok := bytes.CutPrefix(field, []byte("depends="))
		if !ok {
			continue
		}
		var deps []string
		for _, d := range strings.Split(string(v), ",") {
			if d != "" {
				deps = append(deps, d)
			}
		}
		return deps, nil
	}
	return nil, nil
}

// loadOrder is every module of top and everything it depends on, each after its
// dependencies and once, leaving out loaded and what it depends on (modules something
// else loads first). depends gives a module's direct dependencies.
func loadOrder(top, loaded []string, depends func(name string) ([]string, error)) ([]string, error) {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var order []string
	var visit func(m string, skip bool, path []string) error
	visit = func(m string, skip bool, path []string) error {
		switch state[m] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("kernel modules: a dependency cycle: %s", strings.Join(append(path, m), " -> "))
		}
		state[m] = visiting
		deps, err := depends(m)
		if err != nil {
			return fmt.Errorf("kernel module %s: %w", m, err)
		}
		for _, d := range deps {
			if err := visit(d, skip, append(path, m)); err != nil {
				return err
			}
		}
		state[m] = done
		if !skip {
			order = append(order, m)
		}
		return nil
	}
	for _, m := range loaded {
		if err := visit(m, true, nil); err != nil {
			return nil, err
		}
	}
	for _, m := range top {
		if err := visit(m, false, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}
