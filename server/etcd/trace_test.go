package etcd_test

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"

	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/servertest"
)

// TestTraceRPC: with tracing on, an etcd RPC is a server span continuing
// the client's traceparent, and the store's apply of its write is its
// child.
func TestTraceRPC(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, _, cli := start(t, servertest.Options{Server: server.Config{TracerProvider: tp}})
	ctx := metadata.AppendToOutgoingContext(ctxOf(t), "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if _, err := cli.Put(ctx, "/r/a", "1"); err != nil {
		t.Fatal(err)
	}
	var rpc, apply sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(5 * time.Second); (rpc == nil || apply == nil) && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for _, s := range rec.Ended() {
			switch s.Name() {
			case "etcdserverpb.KV/Put":
				rpc = s
			case "store.apply":
				apply = s
			}
		}
	}
	if rpc == nil || apply == nil {
		t.Fatalf("spans ended: %d; want etcdserverpb.KV/Put and store.apply", len(rec.Ended()))
	}
	if rpc.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || rpc.Parent().SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("RPC span: trace %s, parent %s: want the client's traceparent continued", rpc.SpanContext().TraceID(), rpc.Parent().SpanID())
	}
	if apply.Parent().SpanID() != rpc.SpanContext().SpanID() || apply.SpanContext().TraceID() != rpc.SpanContext().TraceID() {
		t.Errorf("store.apply: parent %s, want the RPC's span %s", apply.Parent().SpanID(), rpc.SpanContext().SpanID())
	}
}
