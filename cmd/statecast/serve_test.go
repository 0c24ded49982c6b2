package main

import (
	"strings"
	"testing"
)

// Without auth the server serves anonymous clients, so it must refuse to
// listen anywhere but loopback unless told otherwise.
func TestServeRefusesAnonymousOffLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0", "[::]:0"} {
		err := run(serveFlags{addr: addr, storeURL: "memory", history: 100})
		if err == nil || !strings.Contains(err.Error(), "without auth") {
			t.Errorf("addr %s: got %v, want a refusal naming auth", addr, err)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "localhost:8080": true, "[::1]:8080": true, "127.1.2.3:1": true,
		"0.0.0.0:8080": false, ":8080": false, "10.0.0.1:80": false, "example.com:80": false, "bad": false,
	} {
		if got := isLoopback(addr); got != want {
			t.Errorf("isLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestHistoryClassFlag(t *testing.T) {
	var c classFlag
	if err := c.Set("lobby:=500/10m"); err != nil || len(c) != 1 || c[0].Prefix != "lobby:" || c[0].Retention.MaxEvents != 500 || c[0].Retention.MaxAge.Minutes() != 10 {
		t.Fatalf("lobby:=500/10m → %+v, %v", c, err)
	}
	for _, bad := range []string{"lobby:", "=5", "doc:=x", "doc:=0", "doc:=5/forever"} {
		if err := c.Set(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
