package server

import (
	"cmp"
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/wire"
)

// The inspector: GET /v1/admin/inspect describes this node's loaded rooms
// and connected clients with their watches, for operators and the demo's
// inspector page. It is open to loopback clients; others must send
// Authorization: Bearer <Config.AdminToken>, and get 403 when no token is
// configured.

// InspectReply is the inspector's answer.
type InspectReply struct {
	TimeMS  int64           `json:"time_ms"`
	Rooms   []InspectRoom   `json:"rooms"`
	Clients []InspectClient `json:"clients"`
	// Hooks are the node's webhooks: claim, and per room cursor and lag.
	Hooks []hooks.InspectHook `json:"hooks,omitempty"`
}

// InspectRoom is one loaded room.
type InspectRoom struct {
	Name          string `json:"name"`
	Epoch         string `json:"epoch"`
	Rev           uint64 `json:"rev"`
	Oldest        uint64 `json:"oldest"` // oldest replayable revision (rev+1: no history)
	HistoryEvents int    `json:"history_events"`
	Keys          int    `json:"keys"`
	Watchers      int    `json:"watchers"`
}

// InspectClient is one WebSocket connection that has sent connect.
type InspectClient struct {
	Session string         `json:"session"`
	Subject string         `json:"subject,omitempty"`
	Codec   string         `json:"codec"`
	Watches []InspectWatch `json:"watches"`
}

// InspectWatch is one subscription of a client.
type InspectWatch struct {
	Sub      uint64   `json:"sub"`
	Room     string   `json:"room"`
	Prefixes []string `json:"prefixes"`
	Keys     []string `json:"keys,omitempty"`   // the exact keys it watches besides
	Filter   string   `json:"filter,omitempty"` // the sub's filter expression
	State    string   `json:"state"`
	Head     uint64   `json:"head"`
	Lag      uint64   `json:"lag"` // revisions of the room not yet taken by the connection
	Queued   int      `json:"queued"`
}

func (s *Server) handleInspect(c echo.Context) error {
	if err := s.checkAdmin(c.Request()); err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	return c.JSON(http.StatusOK, s.Inspect())
}

// checkAdmin lets loopback clients through, and others with the admin token.
// A loopback client must also address a loopback name (Host), and a
// request that a proxy forwarded is not a loopback client even when the
// proxy runs on this host: its forwarding headers (which prove nothing
// else) take the loopback pass away. A same-host proxy that adds no such
// header must block /v1/admin/ itself (docs/OPERATIONS.md, the inspector).
func (s *Server) checkAdmin(r *http.Request) error {
	if tok := s.cfg.AdminToken; tok != "" {
		scheme, got, _ := strings.Cut(r.Header.Get(echo.HeaderAuthorization), " ")
		if strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(tok)) == 1 {
			return nil
		}
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil && !forwarded(r) && loopbackHost(r.Host) {
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
			return nil
		}
	}
	if s.cfg.AdminToken == "" {
		return newError(wire.CodeForbidden, "the inspector is served to loopback clients only; start the server with --admin-token to allow others")
	}
	return newError(wire.CodeUnauthorized, "admin token required: send Authorization: Bearer <token>")
}

// loopbackHost reports whether the request names this machine by a
// loopback name: a page on a name that resolves to 127.0.0.1 (DNS
// rebinding) sends its own name, and gets no loopback pass.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// forwardHeaders are the headers proxies add to what they forward: the
// standard ones, the de facto X-Forwarded-* family, and those of common
// proxies and CDNs.
var forwardHeaders = []string{
	"Forwarded", "Via",
	"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-Port", "X-Forwarded-Server",
	"X-Real-Ip", "X-Client-Ip", "X-Cluster-Client-Ip", "True-Client-Ip", "Cf-Connecting-Ip", "Fastly-Client-Ip",
}

// forwarded reports whether a proxy says it forwarded r. A header that is
// present counts even when empty: a proxy that sets X-Forwarded-For to
// what it received (nothing) still forwarded the request.
func forwarded(r *http.Request) bool {
	for _, h := range forwardHeaders {
		if _, ok := r.Header[h]; ok {
			return true
		}
	}
	return false
}

// Inspect describes this node's loaded rooms and connected clients.
func (s *Server) Inspect() InspectReply {
	out := InspectReply{TimeMS: time.Now().UnixMilli(), Rooms: []InspectRoom{}, Clients: []InspectClient{}}
	for _, r := range s.engine.Stats() {
		out.Rooms = append(out.Rooms, InspectRoom{Name: r.Name, Epoch: r.Epoch, Rev: r.Rev, Oldest: r.Oldest,
			HistoryEvents: r.HistoryEvents, Keys: r.Keys, Watchers: r.Watchers})
	}
	slices.SortFunc(out.Rooms, func(a, b InspectRoom) int { return cmp.Compare(a.Name, b.Name) })

	for _, c := range s.connList() {
		if cl, ok := c.inspect(); ok {
			out.Clients = append(out.Clients, cl)
		}
	}
	slices.SortFunc(out.Clients, func(a, b InspectClient) int { return cmp.Compare(a.Session, b.Session) })
	if s.cfg.Webhooks != nil {
		out.Hooks = s.cfg.Webhooks.Inspect()
	}
	return out
}

// inspect describes c; ok is false before its connect or after its end.
// The subscriptions are copied under c.mu and asked for their state after
// releasing it: the watcher takes its room's lock, which comes first in
// the lock order (docs/LOCKS.md).
func (c *conn) inspect() (InspectClient, bool) {
	c.mu.Lock()
	sess, ended := c.sess, c.subs == nil
	subs := make([]*sub, 0, len(c.subs))
	for _, s := range c.subs {
		subs = append(subs, s)
	}
	c.mu.Unlock()
	if sess == nil || ended {
		return InspectClient{}, false
	}
	cl := InspectClient{Session: sess.id, Codec: c.codec.Subprotocol(), Watches: []InspectWatch{}}
	if cc := c.claims.Load(); cc != nil {
		cl.Subject = cc.Subject
	}
	for _, s := range subs {
		st := s.w.Stats()
		iw := InspectWatch{Sub: s.id, Room: s.room, Prefixes: s.w.Prefixes(), Keys: s.w.Keys(),
			State: st.State, Head: st.Head, Lag: st.Behind, Queued: st.Queued}
		if f, ok := s.w.Filter().(fmt.Stringer); ok {
			iw.Filter = f.String()
		}
		cl.Watches = append(cl.Watches, iw)
	}
	slices.SortFunc(cl.Watches, func(a, b InspectWatch) int { return cmp.Compare(a.Sub, b.Sub) })
	return cl, true
}
