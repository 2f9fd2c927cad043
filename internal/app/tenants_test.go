package app

import "testing"

func TestTenantPublicAddress(t *testing.T) {
	for in, ok := range map[string]bool{
		"": true, "198.51.100.7": true, "10.1.2.3": true,
		"127.0.0.1": false, "0.0.0.0": false, "224.0.0.1": false, "2001:db8::1": false, "gate.example": false,
	} {
		ip, err := tenantPublicAddress(in)
		if (err == nil) != ok || (in != "" && ok && ip.String() != in) {
			t.Errorf("tenantPublicAddress(%q) = %v, %v; want ok=%v", in, ip, err, ok)
		}
	}
}
