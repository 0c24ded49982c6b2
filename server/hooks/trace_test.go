package hooks

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// A delivery that follows the store faster than the write's own return
// waits for the write to note its span, and only as long as one is in
// progress for its room, at most maxTraceWait.
func TestTracedAwaitsWritesInProgress(t *testing.T) {
	var tr traced
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}})
	tr.begin("r")
	go func() {
		time.Sleep(20 * time.Millisecond)
		tr.add("r", 7, sc)
		tr.end("r")
	}()
	tr.awaitWrites("r")
	if got := tr.of("r", 7, 7); len(got) != 1 || !got[0].Equal(sc) {
		t.Fatalf("spans of revision 7 after the wait: %v", got)
	}

	start := time.Now()
	tr.awaitWrites("other") // nothing in progress: no wait
	tr.begin("stuck")       // never ends: the wait is bounded
	tr.awaitWrites("stuck")
	if d := time.Since(start); d < maxTraceWait || d > 50*maxTraceWait {
		t.Fatalf("waited %v, want about %v", d, maxTraceWait)
	}
}
