package server

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// BenchmarkHTTPPut: the node's own work for one PUT of a 100-byte value
// on the memory store, from the router to the response body (net/http's
// request parsing and socket I/O are not in it): what the handler chain
// allocates and spends per write.
func BenchmarkHTTPPut(b *testing.B) { benchHTTPPut(b, nil) }

// BenchmarkHTTPPutTraced is BenchmarkHTTPPut with tracing on, every
// request sampled, its spans dropped once ended (no exporter).
func BenchmarkHTTPPutTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	benchHTTPPut(b, tp)
}

func benchHTTPPut(b *testing.B, tp trace.TracerProvider) {
	st := store.NewMemory(store.MemoryConfig{})
	defer st.Close()
	eng := rooms.New(st, rooms.Config{ProgressInterval: -1})
	defer eng.Close()
	srv, err := New(context.Background(), Config{Store: st, Engine: eng, WriteRate: 1e9, TracerProvider: tp})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	h := srv.Handler()
	val := []byte(`"` + strings.Repeat("x", 98) + `"`)
	r, err := http.NewRequest(http.MethodPut, "http://127.0.0.1:8080/v1/rooms/bench/kv/k1", nil)
	if err != nil {
		b.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	r.RemoteAddr = "127.0.0.1:1234"
	body := bytes.NewReader(val)
	w := &discardResponse{}
	b.ReportAllocs()
	for b.Loop() {
		body.Reset(val)
		r.Body, r.ContentLength = io.NopCloser(body), int64(len(val))
		clear(w.h)
		w.code = 0
		h.ServeHTTP(w, r)
		if w.code != http.StatusOK {
			b.Fatalf("status %d", w.code)
		}
	}
}

// discardResponse is a ResponseWriter that keeps only the status.
type discardResponse struct {
	h    http.Header
	code int
}

func (w *discardResponse) Header() http.Header {
	if w.h == nil {
		w.h = http.Header{}
	}
	return w.h
}

func (w *discardResponse) WriteHeader(code int) { w.code = code }

func (w *discardResponse) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return len(p), nil
}
