package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestTracingOn: traces are off by default and follow the standard
// OpenTelemetry variables.
func TestTracingOn(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want bool
		err  bool
	}{
		{env: nil, want: false},
		{env: map[string]string{"OTEL_SERVICE_NAME": "x"}, want: false},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, want: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, want: true},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: true},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, want: false},
		{env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, want: false},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: true},
	} {
		got, err := tracingOn(func(k string) string { return c.env[k] })
		if got != c.want || (err != nil) != c.err {
			t.Errorf("%v: on %v, err %v; want on %v, error %v", c.env, got, err, c.want, c.err)
		}
	}
}

// TestTracingExports: with OTEL_EXPORTER_OTLP_ENDPOINT set, the spans go
// to its /v1/traces over OTLP/HTTP, flushed by the provider's shutdown.
func TestTracingExports(t *testing.T) {
	var posts atomic.Int32
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			posts.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	tp, err := startTracing(context.Background())
	if err != nil || tp == nil {
		t.Fatalf("startTracing: %v, %v", tp, err)
	}
	_, span := tp.Tracer("test").Start(context.Background(), "op")
	span.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if posts.Load() == 0 {
		t.Error("no spans were posted to the collector's /v1/traces")
	}
}
