package server

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/statecast/statecast/server/wire"
)

// Traces (Config.TracerProvider; off by default): a span per HTTP
// request, per WebSocket request and per etcd RPC, with children for the
// store's apply, the validation and connect hooks' calls and, on the node
// that delivers them, the webhook deliveries of the writes. W3C
// traceparent is read on HTTP requests and sent on hook and webhook
// requests. Tracing off, s.tracer is nil and each place pays one nil
// check: no span, no context, no allocation.

// tracerName names statecast's instrumentation.
const tracerName = "github.com/statecast/statecast/server"

// propagator reads and writes W3C traceparent/tracestate headers.
var propagator = propagation.TraceContext{}

// Span attributes.
var (
	attrRoom    = attribute.Key("statecast.room")
	attrSession = attribute.Key("statecast.session")
	attrCode    = attribute.Key("statecast.error_code")
	attrRev     = attribute.Key("statecast.rev")
)

// TracerProvider returns the provider of the node's spans, nil when
// tracing is off (the etcd API instruments its RPCs with it).
func (s *Server) TracerProvider() trace.TracerProvider { return s.cfg.TracerProvider }

// startSpan starts a child span of ctx's of kind, about room when not
// "", or returns ctx and nil when tracing is off. Its options are built
// only then: building them cost the write path 3 allocations.
func (s *Server) startSpan(ctx context.Context, name string, kind trace.SpanKind, room string) (context.Context, trace.Span) {
	if s.tracer == nil {
		return ctx, nil
	}
	ctx, span := s.tracer.Start(ctx, name, trace.WithSpanKind(kind))
	if room != "" {
		span.SetAttributes(attrRoom.String(room))
	}
	return ctx, span
}

// endSpan ends span (nil: tracing off), failed with err's code when err
// is not nil.
func endSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		failSpan(span, errorOf(err, false))
	}
	span.End()
}

// failSpan marks span failed with e.
func failSpan(span trace.Span, e *Error) {
	span.SetAttributes(attrCode.String(e.Code))
	if e.cause != nil {
		span.RecordError(e.cause)
	}
	span.SetStatus(codes.Error, e.Code)
}

// traceHTTP is the middleware of every HTTP request when tracing is on:
// a server span named by the route, continuing the trace of the
// request's traceparent.
func (s *Server) traceHTTP(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		ctx := propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := s.tracer.Start(ctx, r.Method+" "+route, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("http.route", route),
				attribute.String("url.path", r.URL.Path)))
		defer span.End()
		if room := c.Param("room"); room != "" {
			span.SetAttributes(attrRoom.String(room))
		}
		c.SetRequest(r.WithContext(ctx))
		err := next(c)
		if err != nil {
			c.Error(err) // answered here, so the span sees the status
		}
		status := c.Response().Status
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		if status >= http.StatusInternalServerError {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
		return nil
	}
}

// traceRequest starts the span of one WebSocket request, a root span
// linked to the span of the upgrade request when it had one.
func (c *conn) traceRequest(r *wire.Request) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	if c.upgrade.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: c.upgrade}))
	}
	ctx, span := c.s.tracer.Start(c.ctx, "ws "+r.T, opts...)
	if r.Room != "" {
		span.SetAttributes(attrRoom.String(r.Room))
	}
	if c.sess != nil {
		span.SetAttributes(attrSession.String(c.sess.id))
	}
	return ctx, span
}
