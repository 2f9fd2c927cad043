// Command svcprobe is the probe the Services and DNS rows run in pods (a static binary in an
// image of its own): an HTTP server naming its pod, and clients that fetch, resolve and time.
//
//	svcprobe serve PORT                    answer every request with $POD_NAME
//	svcprobe get URL [CAFILE [TOKENFILE]]  one GET; prints "STATUS BODY" (CA and bearer token optional)
//	svcprobe resolve NAME                  prints the addresses, sorted, comma-separated
//	svcprobe bench-get URL N               N GETs on fresh connections; prints p50 and p99
//	svcprobe bench-dns NAME N              N lookups (no cache in the pod); prints p50 and p99
//	svcprobe webhook PORT CERT KEY         an admission webhook over TLS: denies objects named denied-*
//	svcprobe sleep                         until killed
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: svcprobe serve|get|resolve|bench-get|bench-dns|sleep ...")
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "serve":
		name := os.Getenv("POD_NAME")
		err := http.ListenAndServe(":"+args[0], http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, name)
		}))
		fail(err.Error())
	case "get":
		c, err := client(args[1:])
		if err != nil {
			fail(err.Error())
		}
		req, _ := http.NewRequest("GET", args[0], nil)
		if len(args) > 2 {
			tok, err := os.ReadFile(args[2])
			if err != nil {
				tok = []byte(args[2]) // a literal token
			}
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		}
		resp, err := c.Do(req)
		if err != nil {
			fail(err.Error())
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		fmt.Printf("%d %s\n", resp.StatusCode, strings.Join(strings.Fields(string(b)), " "))
	case "resolve":
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		addrs, err := net.DefaultResolver.LookupHost(ctx, args[0])
		if err != nil {
			fail(err.Error())
		}
		sort.Strings(addrs)
		fmt.Println(strings.Join(addrs, ","))
	case "bench-get", "bench-dns":
		n, _ := strconv.Atoi(args[1])
		var ds []time.Duration
		for i := 0; i < n; i++ {
			t := time.Now()
			var err error
			if os.Args[1] == "bench-get" {
				var resp *http.Response
				c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
				if resp, err = c.Get(args[0]); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			} else {
				_, err = net.DefaultResolver.LookupHost(context.Background(), args[0])
			}
			if err != nil {
				fail(err.Error())
			}
			ds = append(ds, time.Since(t))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		fmt.Printf("n=%d p50=%s p99=%s\n", n, ds[len(ds)/2], ds[(len(ds)*99)/100])
	case "webhook":
		http.HandleFunc("/", admit)
		fail(http.ListenAndServeTLS(":"+args[0], args[1], args[2], nil).Error())
	case "sleep":
		for {
			time.Sleep(time.Hour)
		}
	default:
		fail("unknown command " + os.Args[1])
	}
}

// admit answers an AdmissionReview: an object whose name starts with "denied-" is refused.
func admit(w http.ResponseWriter, r *http.Request) {
	var review struct {
		Request struct {
			UID  string `json:"uid"`
			Name string `json:"name"`
		} `json:"request"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&review); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp := map[string]any{"uid": review.Request.UID, "allowed": true}
	if strings.HasPrefix(review.Request.Name, "denied-") {
		resp["allowed"] = false
		resp["status"] = map[string]any{"code": 403, "message": "denied by the probe webhook in pod " + os.Getenv("POD_NAME")}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp})
}

// client is an HTTP client trusting the CA file named first in args, if any.
func client(args []string) (*http.Client, error) {
	tr := &http.Transport{DisableKeepAlives: true}
	if len(args) > 0 && args[0] != "" {
		pem, err := os.ReadFile(args[0])
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in %s", args[0])
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: tr}, nil
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "svcprobe:", msg)
	os.Exit(1)
}
