package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealthcheck(t *testing.T) {
	status := http.StatusOK
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
	}))
	addr := strings.TrimPrefix(ts.URL, "http://")
	if err := healthcheck([]string{"--addr", addr}); err != nil {
		t.Errorf("healthy server: %v", err)
	}
	status = http.StatusServiceUnavailable
	if err := healthcheck([]string{"--addr", addr}); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("503: got %v, want an error naming 503", err)
	}
	ts.Close()
	if err := healthcheck([]string{"--addr", addr, "--timeout", "1s"}); err == nil {
		t.Error("no server: got nil, want an error")
	}
}

func TestHealthURL(t *testing.T) {
	for addr, want := range map[string]string{
		"0.0.0.0:8080":   "http://127.0.0.1:8080/healthz",
		":9000":          "http://127.0.0.1:9000/healthz",
		"[::]:8080":      "http://127.0.0.1:8080/healthz",
		"127.0.0.1:8080": "http://127.0.0.1:8080/healthz",
		"[::1]:8080":     "http://[::1]:8080/healthz",
	} {
		if got, err := healthURL(addr); err != nil || got != want {
			t.Errorf("healthURL(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
	if _, err := healthURL("8080"); err == nil {
		t.Error(`healthURL("8080"): want an error`)
	}
}
