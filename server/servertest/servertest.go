// Package servertest starts in-process statecast nodes for tests: a store,
// a room engine and a server, served on a loopback httptest server as
// statecast serve serves it, with every HTTP request and answer checked
// against the API's OpenAPI description. Only tests import it.
package servertest

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/internal/openapicheck"
	"github.com/statecast/statecast/store"
)

// Options says how to start a node. Zero values take the defaults: a
// memory store and default engine and server configurations.
type Options struct {
	Server server.Config // Store, Engine, Registerer and Gatherer are set by Start
	Rooms  rooms.Config
	Memory store.MemoryConfig // the memory store's; its Retention and Limits are also the file store's
	File   string             // when set, a file store at this path
	Store  store.Store        // when set, this store (closed with the node)
	// SendBuffer, when set, is the socket send buffer of every accepted
	// connection: a socket that is not read then fills after a few
	// hundred KB instead of the several MB of loopback autotuning.
	SendBuffer int
	// Unchecked serves without the OpenAPI check, which reads every
	// answer's body (a copy of each stream): for tests that measure what
	// the server itself allocates.
	Unchecked bool
}

// Node is one running node: a store, an engine, a server and its HTTP
// listener.
type Node struct {
	Store    store.Store
	Engine   *rooms.Engine
	Server   *server.Server
	TS       *httptest.Server
	WS       string       // ws://…/v1/ws
	HTTP     *client.HTTP // the HTTP API, without a token
	Registry *prometheus.Registry

	t        testing.TB
	stopOnce sync.Once
}

// Start starts a node; it is stopped when the test ends, or earlier by
// Stop.
func Start(t testing.TB, o Options) *Node {
	t.Helper()
	st := o.Store
	switch {
	case st != nil:
	case o.File != "":
		f, err := store.OpenFile(store.FileConfig{Path: o.File, Retention: o.Memory.Retention, Limits: o.Memory.Limits})
		if err != nil {
			t.Fatal(err)
		}
		st = f
	default:
		st = store.NewMemory(o.Memory)
	}
	eng := rooms.New(st, o.Rooms)
	cfg := o.Server
	cfg.Store, cfg.Engine = st, eng
	reg := prometheus.NewRegistry()
	cfg.Registerer, cfg.Gatherer = reg, reg
	srv, err := server.New(context.Background(), cfg)
	if err != nil {
		_ = eng.Close()
		_ = st.Close()
		t.Fatal(err)
	}
	// Served as statecast serve serves it: its http.Server (timeouts) on
	// its Listener (connection limits).
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = srv.HTTPServer()
	if !o.Unchecked {
		ts.Config.Handler = CheckOpenAPI(t, ts.Config.Handler)
	}
	if o.SendBuffer > 0 {
		ts.Listener = sendBufferListener{ts.Listener, o.SendBuffer}
	}
	ts.Listener = srv.Listener(ts.Listener)
	ts.Start()
	n := &Node{t: t, Store: st, Engine: eng, Server: srv, TS: ts, Registry: reg,
		WS:   "ws" + strings.TrimPrefix(ts.URL, "http") + "/v1/ws",
		HTTP: &client.HTTP{URL: ts.URL}}
	t.Cleanup(n.Stop)
	return n
}

// Stop shuts the node down as a deploy would: server, listener, engine,
// store. It may be called more than once.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := n.Server.Shutdown(ctx); err != nil {
			n.t.Errorf("Shutdown: %v", err)
		}
		n.TS.Close()
		_ = n.Engine.Close() // may have been closed by the test
		_ = n.Store.Close()
	})
}

// Counter returns the value of a counter or gauge of the node's registry,
// summed over its labels when labels is empty, else the series whose
// labels include them (name, value pairs).
func (n *Node) Counter(name string, labels ...string) float64 {
	n.t.Helper()
	mfs, err := n.Registry.Gather()
	if err != nil {
		n.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// sendBufferListener sets the send buffer of the connections it accepts.
type sendBufferListener struct {
	net.Listener
	size int
}

func (l sendBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(l.size)
	}
	return c, err
}

// loadOpenAPI returns the server's OpenAPI description, loaded once.
var loadOpenAPI = openapicheck.Loader(server.OpenAPI())

// CheckOpenAPI serves h, checking every request and its answer against the
// server's OpenAPI description (server/openapi.json): a request the
// description does not allow must be refused, and an answer must be one
// its operation documents, headers, body and SSE events included. A
// mismatch fails t. Start puts it in front of every node.
func CheckOpenAPI(t testing.TB, h http.Handler) http.Handler {
	return openapicheck.Handler(t, loadOpenAPI(t), h)
}

// Context returns a context that ends after 30 s, or when the test ends:
// it bounds a test so that a missing message fails it instead of hanging
// the run.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// AssertViewIsRoom checks that v holds exactly the room's keys at the
// room's revision and epoch, as a fresh snapshot would, reading the room
// through h.
func AssertViewIsRoom(t testing.TB, h *client.HTTP, room string, v *client.View) {
	t.Helper()
	l, err := h.List(Context(t), room, "")
	if err != nil {
		t.Fatal(err)
	}
	if l.Rev != v.Rev || l.Epoch != v.Epoch {
		t.Fatalf("view at %s/%d, room at %s/%d", v.Epoch, v.Rev, l.Epoch, l.Rev)
	}
	got, _ := json.Marshal(v.Sorted())
	want, _ := json.Marshal(l.Items)
	if string(got) != string(want) {
		t.Fatalf("view %.2000s\nroom %.2000s", got, want)
	}
}
