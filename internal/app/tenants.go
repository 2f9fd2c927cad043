package app

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"socialweb.computer/internal/tenant"
)

// startTenants makes the manager of tenant control planes for `socialweb up`: their data
// under <data dir>/tenants, the child processes run from this very binary. Without an
// advertise address it returns nil and the reason, which every Cluster then reports. Every
// cluster enforces policy at least.
func startTenants(dataDir, advertise, public string, policy tenant.PodPolicy, log *slog.Logger) (*tenant.Manager, string) {
	var ip net.IP
	var err error
	if advertise != "" {
		ip, err = tenant.CheckAdvertiseAddress(advertise)
	} else {
		ip, err = tenant.EnsureAdvertiseAddress()
	}
	if err != nil {
		return nil, err.Error()
	}
	pub, err := tenantPublicAddress(public)
	if err != nil {
		return nil, err.Error()
	}
	bin, err := os.Executable()
	if err != nil {
		return nil, "cannot find this binary to run tenant control planes from: " + err.Error()
	}
	m, err := tenant.NewManager(tenant.Config{Root: filepath.Join(dataDir, "tenants"), Binary: bin, Advertise: ip, PublicAddress: pub, PodSecurity: policy.Level, PodUserNamespaces: policy.UserNamespaces, Logger: log})
	if err != nil {
		return nil, err.Error()
	}
	return m, ""
}

// tenantPublicAddress parses up's --tenant-address: nil when empty, else an IPv4 address that
// is neither loopback nor unspecified.
func tenantPublicAddress(s string) (net.IP, error) {
	if s == "" {
		return nil, nil
	}
	ip := net.ParseIP(s).To4()
	if ip == nil || ip.IsLoopback() || ip.IsUnspecified() || ip.IsMulticast() {
		return nil, fmt.Errorf("--tenant-address %q: want this host's public IPv4 address, where nodes on other hosts reach it", s)
	}
	return ip, nil
}
