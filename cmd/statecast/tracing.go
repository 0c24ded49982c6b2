package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// tracingOn reports whether the standard OpenTelemetry variables ask for
// traces: OTEL_TRACES_EXPORTER=otlp, or an OTLP endpoint with no
// exporter named; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none
// turn them off. Off by default.
func tracingOn(getenv func(string) string) (bool, error) {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "otlp":
		return true, nil
	case "none":
		return false, nil
	case "":
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "", nil
	default:
		return false, fmt.Errorf("OTEL_TRACES_EXPORTER=%s: statecast exports traces with otlp only (or none)", exp)
	}
}

// startTracing returns the node's tracer provider when the environment
// asks for traces (tracingOn), else nil: an OTLP/HTTP exporter that the
// OTEL_EXPORTER_OTLP_* variables configure, the sampler of
// OTEL_TRACES_SAMPLER (default: parent-based, always on), service name
// "statecast" unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES says
// otherwise. Shutting it down flushes the spans not yet exported.
func startTracing(ctx context.Context) (*sdktrace.TracerProvider, error) {
	on, err := tracingOn(os.Getenv)
	if err != nil || !on {
		return nil, err
	}
	if p := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"); p != "" && p != "http/protobuf" {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=%s: statecast exports traces over http/protobuf only", p)
	}
	if p := os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" && p != "http/protobuf" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") == "" {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: statecast exports traces over http/protobuf only", p)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	// Later options win: the environment's names over the default.
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", "statecast")),
		resource.WithTelemetrySDK(), resource.WithHost(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
