//go:build !crashpoints

package crashpoint

// Enabled reports whether this binary honours Env.
const Enabled = false

// Hit does nothing: this binary was built without the crashpoints tag.
func Hit(string) {}
