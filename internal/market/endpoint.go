package market

import "net"

// PlainHTTPAllowed says whether a secrets endpoint on host may be plain http: only a
// loopback host, where nothing crosses a network. Requesters refuse any other http
// endpointUrl, and a bidder refuses to publish one.
func PlainHTTPAllowed(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
