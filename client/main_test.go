package client_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/store"
)

// The client's reader and keepalive goroutines end with their connection,
// and Watch's request with its context: nothing may outlive a test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testServer is a real server on a memory store, in process.
type testServer struct {
	WS   string // ws://…/v1/ws
	HTTP *client.HTTP
}

// newServer starts a server; cfg's Store and Engine are filled in. It is
// shut down when the test ends.
func newServer(t testing.TB, cfg server.Config) *testServer {
	t.Helper()
	st := store.NewMemory(store.MemoryConfig{})
	eng := rooms.New(st, rooms.Config{})
	cfg.Store, cfg.Engine = st, eng
	srv, err := server.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		ts.Close()
		_ = eng.Close()
		_ = st.Close()
	})
	return &testServer{
		WS:   "ws" + strings.TrimPrefix(ts.URL, "http") + "/v1/ws",
		HTTP: &client.HTTP{URL: ts.URL},
	}
}

// dial connects with codec and closes the connection when the test ends.
func dial(t *testing.T, s *testServer, codec string) *client.Conn {
	t.Helper()
	c, err := client.Dial(testCtx(t), s.WS, &client.Options{Codec: codec})
	if err != nil {
		t.Fatalf("Dial(%s): %v", codec, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testCtx bounds a test so that a missing message fails it instead of
// hanging the run.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var codecs = []string{"json", "msgpack"}
