package pds

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// PublicURL is where the world reaches this PDS: the #atproto_pds endpoint of its accounts'
// DID documents, the host of its service DID (did:web:<Hostname>), and the hostname it asks
// relays to crawl.
type PublicURL struct {
	Scheme string // https, or http for a special-use name (see ParsePublicURL)
	Host   string // lower-case DNS name, no port
	Port   string // only with Host "localhost"
}

// String is the URL, scheme://host[:port], with no trailing slash (as DID documents carry it).
func (u PublicURL) String() string {
	if u.Port != "" {
		return u.Scheme + "://" + net.JoinHostPort(u.Host, u.Port)
	}
	return u.Scheme + "://" + u.Host
}

// CrawlHostname is the hostname field of requestCrawl as indigo's relay parses it
// (relay.ParseHostname): the bare name for https, which the relay takes as https; the whole
// URL otherwise, so an http host is crawled over http (by a relay run with
// --allow-insecure-hosts) and localhost keeps its port.
func (u PublicURL) CrawlHostname() string {
	if u.Scheme == "https" && u.Port == "" {
		return u.Host
	}
	return u.String()
}

// PublicURLError is a public URL this PDS cannot be published under.
type PublicURLError struct {
	URL    string
	Reason string
}

func (e *PublicURLError) Error() string {
	return fmt.Sprintf("public URL %q: %s", e.URL, e.Reason)
}

// specialUse are the names RFC 6761 and RFC 2606 keep out of the public DNS: no one outside
// this machine or a test network can be reached under them, so http cannot expose anything
// there that https would have protected.
var specialUse = []string{"localhost", "test", "example", "invalid"}

func isSpecialUse(host string) bool {
	for _, d := range specialUse {
		if host == d || strings.HasSuffix(host, "."+d) {
			return true
		}
	}
	return false
}

// ParsePublicURL checks a public URL as the reference PDS's PDS_HOSTNAME would have it
// (publicUrl = https://<hostname>) and as relays and did:web need it:
//   - https://NAME, NAME a DNS name of two labels or more (a did:web and a handle are DNS
//     names, and indigo's relay refuses to crawl an IP address or a one-word name);
//   - no port (the relay refuses a port on any name but localhost, and did:web would have
//     to carry it), except on localhost, which the reference also serves as
//     http://localhost:<port>;
//   - http only on special-use names (localhost, *.localhost, *.test, *.example, *.invalid),
//     which cannot be public; sessions and passwords go over it;
//   - no user, path, query or fragment: DID documents name the service root.
func ParsePublicURL(raw string) (PublicURL, error) {
	bad := func(format string, args ...any) (PublicURL, error) {
		return PublicURL{}, &PublicURLError{URL: raw, Reason: fmt.Sprintf(format, args...)}
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return bad("not an absolute URL; want https://<host name>, e.g. https://pds.example.com")
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return bad("scheme %q; want https://<host name>", u.Scheme)
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return bad("has a user, path, query or fragment; want the service root, https://<host name>")
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if net.ParseIP(host) != nil {
		return bad("an IP address; a DNS name is needed (did:web and relays name a PDS by host name), e.g. https://pds.example.com")
	}
	out := PublicURL{Scheme: u.Scheme, Host: host, Port: u.Port()}
	if host == "localhost" {
		return out, nil
	}
	if _, err := syntax.ParseHandle(host); err != nil {
		return bad("%q is not a DNS name of two labels or more (did:web and relays need one)", host)
	}
	if out.Port != "" {
		return bad("a port (%s): relays crawl a PDS by host name alone, on 443; serve it there (behind a proxy) or use localhost", out.Port)
	}
	if out.Scheme == "http" && !isSpecialUse(host) {
		return bad("http on a public name: sessions and passwords would cross the network in clear; use https (http is for localhost, *.localhost, *.test, *.example, *.invalid)")
	}
	return out, nil
}

// RelayURLError is a relay this PDS cannot ask to crawl it.
type RelayURLError struct {
	URL    string
	Reason string
}

func (e *RelayURLError) Error() string {
	return fmt.Sprintf("relay %q: %s", e.URL, e.Reason)
}

// ParseRelayURL checks a relay's XRPC base URL, http or https (requestCrawl carries only the
// public host name, nothing secret) and returns it without a trailing slash.
func ParseRelayURL(raw string) (string, error) {
	bad := func(reason string) (string, error) { return "", &RelayURLError{URL: raw, Reason: reason} }
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Hostname() == "" {
		return bad("not an absolute URL; want the relay's base, e.g. https://relay.example.com")
	}
	switch u.Scheme {
	case "https", "http":
	case "wss", "ws":
		return bad("a firehose URL; want the relay's XRPC base, https://" + u.Host)
	default:
		return bad(fmt.Sprintf("scheme %q; want https://<relay host>", u.Scheme))
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return bad("has a user, query or fragment; want the relay's base, https://<relay host>")
	}
	return strings.TrimSuffix(u.String(), "/"), nil
}
