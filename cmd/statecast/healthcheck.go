package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"
)

// healthcheck asks the server on this machine for /healthz and fails
// unless it answers 200. It is the container image's HEALTHCHECK: the
// distroless base image has no shell and no curl. --addr is serve's listen
// address (same flag, same STATECAST_ADDR), so both agree on the port.
func healthcheck(args []string) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "the server's listen address HOST:PORT (a wildcard host means this machine)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	url, err := healthURL(*addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("unhealthy: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("unhealthy: GET %s: %s", url, resp.Status)
	}
	return nil
}

// healthURL is the /healthz URL of a server listening on addr; a wildcard
// or empty host (0.0.0.0, ::) is reached on loopback.
func healthURL(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--addr %q: %v", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/healthz", nil
}
