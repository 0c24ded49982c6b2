package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redisstore"
	"github.com/statecast/statecast/store/redistest"
)

// TestLeasesAcrossNodes: on a store that several nodes share, the leased
// keys of a node that stops beating are deleted by exactly one survivor
// within the node timeout (plus a beat period and a scan), as ordinary
// delete events; a starting node never adopts the keys of a live one.
func TestLeasesAcrossNodes(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	open := func() store.Store {
		st, err := redisstore.New(ctx, redisstore.Config{URL: rs.URL(), Prefix: "lt"})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	const timeout, grace = time.Second, 200 * time.Millisecond
	node := func(id string) *servertest.Node {
		return servertest.Start(t, servertest.Options{Store: open(), Server: server.Config{NodeID: id, NodeTimeout: timeout, LeaseGrace: grace}})
	}
	a, b, c := node("a"), node("b"), node("c")

	// A client of node a holds a session-leased key; a watcher on node b
	// records every event of the room.
	ca := dialCodec(t, a, "json")
	if _, err := ca.Put(ctx, room, "presence/a", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	_, next := watchKeys(t, dialCodec(t, b, "json"), room)

	// A node that died an hour ago, with a leased key: its process is
	// gone, so a bare store handle writes what it left behind.
	ghost := open()
	defer ghost.Close()
	if _, err := ghost.Apply(ctx, room, store.Write{Ops: []store.Op{
		{Type: store.OpPut, Key: "presence/ghost", Value: []byte(`1`), Lease: "ghost/s_1"}}}); err != nil {
		t.Fatal(err)
	}
	// Its last beat, an hour ago by the Redis server's clock.
	if _, err := redistest.Do(rs.Addr(), "ZADD", "lt:nodes", strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10), "ghost"); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{"put:presence/ghost"}) {
		t.Fatalf("events %v, want the ghost's put", got)
	}
	start := time.Now()
	if got := next(); !slices.Equal(got, []string{"delete:presence/ghost"}) {
		t.Fatalf("events %v, want the ghost's key deleted", got)
	}
	// Node timeout + a beat + a scan; the scan's share has room for -race
	// on a loaded CI machine (it took up to 3.3 s there).
	if took, bound := time.Since(start), timeout+timeout/5+5*time.Second; took > bound {
		t.Errorf("the dead node's key was deleted after %v, want within %v", took, bound)
	}
	alive, stale, err := ghost.(store.Nodes).Registered(ctx, timeout)
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 0 || len(alive) != 3 {
		t.Errorf("registry after the claim: alive %v, stale %v; want a, b and c alive only", alive, stale)
	}

	// A node starting now sees node a alive: it must not adopt a's key,
	// even once its lease grace has passed. Exactly one delete happened:
	// the next event is the marker written after waiting.
	node("d")
	time.Sleep(grace + timeout)
	if _, err := ca.Put(ctx, room, "marker", 1); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{"put:marker"}) {
		t.Fatalf("events %v, want only the marker: the dead node's key deleted once, node a's key kept", got)
	}
	_ = c

	// A key of a node gone from the registry altogether (its claimer
	// died mid-sweep) is deleted by the periodic sweep, within five node
	// timeouts.
	if _, err := ghost.Apply(ctx, room, store.Write{Ops: []store.Op{
		{Type: store.OpPut, Key: "presence/orphan", Value: []byte(`1`), Lease: "gone.1/s_2"}}}); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{"put:presence/orphan"}) {
		t.Fatalf("events %v, want the orphan's put", got)
	}
	start = time.Now()
	if got := next(); !slices.Equal(got, []string{"delete:presence/orphan"}) {
		t.Fatalf("events %v, want the orphan deleted", got)
	}
	if took, bound := time.Since(start), 5*timeout+5*time.Second; took > bound {
		t.Errorf("the orphan was deleted after %v, want within %v", took, bound)
	}

	// Fencing: node a is taken for dead (its registration removed, as a
	// claim does, while it could not beat). At its next beat it ends its
	// leases and its clients reconnect with 1012.
	alive, _, err = ghost.(store.Nodes).Registered(ctx, timeout)
	if err != nil {
		t.Fatal(err)
	}
	var nodeA string
	for _, n := range alive {
		if strings.HasPrefix(n, "a.") {
			nodeA = n
		}
	}
	if _, err := redistest.Do(rs.Addr(), "ZREM", "lt:nodes", nodeA); err != nil || nodeA == "" {
		t.Fatalf("removing node a (%q): %v", nodeA, err)
	}
	if got := next(); !slices.Equal(got, []string{"delete:presence/a"}) {
		t.Fatalf("events %v, want node a's key deleted once it found itself fenced", got)
	}
	select {
	case <-ca.Done():
		if websocket.CloseStatus(ca.Err()) != websocket.StatusServiceRestart {
			t.Errorf("node a's client closed with %v, want 1012 (reconnect)", ca.Err())
		}
	case <-time.After(5 * time.Second):
		t.Error("node a's client was not asked to reconnect after the fence")
	}
}

// The lease names a node stores carry the node, so the survivors know
// whose keys they are; the name on the wire stays a flag.
func TestLeaseStoredUnderNode(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: server.Config{NodeID: "n1"}})
	ctx := context.Background()
	c := dialCodec(t, e, "json")
	if _, err := c.Put(servertest.Context(t), "r", "k", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	var leases []string
	if err := e.Store.Leased(ctx, func(_ string, kv store.KV) error { leases = append(leases, kv.Lease); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(leases) != 1 || !strings.HasPrefix(leases[0], "n1.") || !strings.Contains(leases[0], "/session:") {
		t.Fatalf("stored leases %q, want one under node n1", leases)
	}
}

// TestLeaseKeptAcrossRestart: a graceful shutdown writes the node's TTL
// leases to the file store, and the next start gives each back to its
// holder with its deadline: kept alive and written to as before, or ended
// at once when its deadline passed while no server ran. A lease without a
// record (the state a crash leaves) is adopted with no owner: it can no
// longer be kept alive, revoked or written to (not found, as an ended
// lease: its writer grants a new one), and its keys end after the grace.
func TestLeaseKeptAcrossRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "statecast.db")
	ctx := servertest.Context(t)
	e1 := servertest.Start(t, servertest.Options{File: path})
	grant := func(ttl time.Duration, room string) string {
		t.Helper()
		id, err := e1.HTTP.GrantLease(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e1.HTTP.Put(ctx, room, "k", json.RawMessage(`1`), nil, id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	kept, lapsed, crashed := grant(time.Minute, "kept"), grant(time.Second, "lapsed"), grant(time.Minute, "crashed")
	lapsedDue := time.Now().Add(time.Second)
	e1.Stop()
	f, err := store.OpenFile(store.FileConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	recs, err := f.LeaseRecords(ctx)
	if err != nil || len(recs) != 3 {
		t.Fatalf("lease records after a graceful shutdown: %+v, %v; want 3", recs, err)
	}
	if err := f.DeleteLeaseRecord(ctx, crashed); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(lapsedDue))

	const grace = 4 * time.Second
	started := time.Now() // before recover: the adopted lease's grace starts after
	e2 := servertest.Start(t, servertest.Options{File: path, Server: server.Config{LeaseGrace: grace}})
	if err := e2.HTTP.KeepAlive(ctx, kept); err != nil {
		t.Errorf("keep-alive of a lease kept across the restart: %v", err)
	}
	if _, err := e2.HTTP.Put(ctx, "kept", "k2", json.RawMessage(`1`), nil, kept); err != nil {
		t.Errorf("put under a lease kept across the restart: %v", err)
	}
	if err := e2.HTTP.KeepAlive(ctx, lapsed); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("keep-alive of a lease whose deadline passed while no server ran: %v, want not found", err)
	}
	if err := e2.HTTP.KeepAlive(ctx, crashed); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("keep-alive of an adopted lease: %v, want not found", err)
	}
	if _, err := e2.HTTP.Put(ctx, "crashed", "k2", json.RawMessage(`1`), nil, crashed); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("put under an adopted lease: %v, want not found", err)
	}
	empty := func(room string) func() bool {
		return func() bool {
			l, err := e2.HTTP.List(ctx, room, "")
			return err == nil && len(l.Items) == 0
		}
	}
	waitFor(t, grace/2, "the lapsed lease's key to be deleted at the start, not a grace later", empty("lapsed"))
	waitFor(t, 10*time.Second, "the adopted lease's key to be deleted", empty("crashed"))
	if d := time.Since(started); d < grace {
		t.Errorf("the adopted lease's key was deleted %v after the start, before the grace", d)
	}
	if l, err := e2.HTTP.List(ctx, "kept", ""); err != nil || len(l.Items) != 2 {
		t.Errorf("keys of the lease kept across the restart: %+v, %v", l, err)
	}
}

// TestSessionResumedOnAnotherNode: on a store several nodes share, a
// client resumes its session on another node while its old connection is
// still open. The session's keys stay when the old connection closes
// (that node no longer owns the session) and past the grace (which
// secrets resume is storetest's testSharedSessions); once the new connection is gone for
// the grace, every key of the session, written through either node, is
// deleted, each once.
func TestSessionResumedOnAnotherNode(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	const timeout, grace = time.Second, 300 * time.Millisecond
	node := func(id string) *servertest.Node {
		return redisNode(t, rs.URL(), "rs", server.Config{NodeID: id, NodeTimeout: timeout, LeaseGrace: grace})
	}
	a, b := node("a"), node("b")
	_, next := watchKeys(t, dialCodec(t, b, "json"), room)

	ca := dialCodec(t, a, "json")
	if _, err := ca.Put(ctx, room, "x", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	first := ca.Connected()
	cb := dial(t, b, &client.Options{Codec: "json", Session: first.Session, Resume: first.Resume})
	if got := cb.Connected(); !got.Resumed || got.Session != first.Session {
		t.Fatalf("resume on node b: %+v, want session %s resumed", got, first.Session)
	}
	if _, err := cb.Put(ctx, room, "y", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	ca.CloseNow()
	time.Sleep(3 * grace)
	if _, err := cb.Put(ctx, room, "marker", 1); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"put:x", "put:y", "put:marker"} {
		if got := next(); !slices.Equal(got, []string{want}) {
			t.Fatalf("events %v, want %s: the session's keys kept while it is attached on node b", got, want)
		}
	}

	cb.CloseNow()
	var deleted []string
	for len(deleted) < 2 {
		deleted = append(deleted, next()...)
	}
	slices.Sort(deleted)
	if !slices.Equal(deleted, []string{"delete:x", "delete:y"}) {
		t.Fatalf("events %v, want the session's two keys deleted", deleted)
	}
	time.Sleep(grace + timeout)
	cm := dialCodec(t, a, "json")
	if _, err := cm.Put(ctx, room, "marker", 2); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{"put:marker"}) {
		t.Fatalf("events %v, want only the marker: each key deleted once", got)
	}
}

// TestSessionOrphansEnd: what a node that died half-way leaves behind on
// a store with shared sessions ends anyway, each key deleted once: a
// session still attached to a node gone from the registry (its claimer
// died before starting its grace), and a key under a session whose
// record is gone (its ender died before deleting it).
func TestSessionOrphansEnd(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	const timeout, grace = 500 * time.Millisecond, 200 * time.Millisecond
	ghost, err := redisstore.New(ctx, redisstore.Config{URL: rs.URL(), Prefix: "so"})
	if err != nil {
		t.Fatal(err)
	}
	defer ghost.Close()
	if err := ghost.SaveSession(ctx, store.SessionRecord{ID: "s_1", Subject: "u", ResumeHash: make([]byte, 32), Lease: "session:s_1", Owner: "gone.1"}); err != nil {
		t.Fatal(err)
	}
	st, err := redisstore.New(ctx, redisstore.Config{URL: rs.URL(), Prefix: "so"})
	if err != nil {
		t.Fatal(err)
	}
	e := servertest.Start(t, servertest.Options{Store: st, Server: server.Config{NodeID: "a", NodeTimeout: timeout, LeaseGrace: grace}})
	_, next := watchKeys(t, dialCodec(t, e, "json"), room)
	for _, kv := range [][2]string{{"attached", "session:s_1"}, {"ended", "session:s_2"}} {
		if _, err := ghost.Apply(ctx, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: kv[0], Value: []byte(`1`), Lease: kv[1]}}}); err != nil {
			t.Fatal(err)
		}
	}
	var deleted []string
	for len(deleted) < 2 {
		for _, ev := range next() {
			if strings.HasPrefix(ev, "delete:") {
				deleted = append(deleted, ev)
			}
		}
	}
	slices.Sort(deleted)
	if !slices.Equal(deleted, []string{"delete:attached", "delete:ended"}) {
		t.Fatalf("deleted %v, want both orphans", deleted)
	}
	if _, ok, err := ghost.Session(ctx, "s_1"); ok || err != nil {
		t.Fatalf("the dead node's session record is left: %v %v", ok, err)
	}
	// Past another orphan sweep: nothing is deleted twice.
	time.Sleep(30 * timeout / 5)
	if _, err := ghost.Apply(ctx, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "marker", Value: []byte(`1`)}}}); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{"put:marker"}) {
		t.Fatalf("events %v, want only the marker", got)
	}
}

// TestTTLLeasesAcrossNodes: on a store several nodes share, a TTL lease
// granted through one node is kept alive, written under and revoked
// through any other, by its subject only, and outlives the node that
// granted it; left alone, it ends once across the cluster: each of its
// keys is deleted by exactly one delete event.
func TestTTLLeasesAcrossNodes(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	authn, err := auth.New(auth.Config{HMACSecret: hmacSecret})
	if err != nil {
		t.Fatal(err)
	}
	const timeout, ttl = time.Second, 1500 * time.Millisecond
	node := func(id string) *servertest.Node {
		return redisNode(t, rs.URL(), "tl", server.Config{NodeID: id, NodeTimeout: timeout, Auth: authn})
	}
	a, b, c := node("a"), node("b"), node("c")
	alice := tokenFor(t, "alice", time.Now().Add(time.Hour), allRooms)
	as := func(e *servertest.Node, tok string) *client.HTTP { return &client.HTTP{URL: e.TS.URL, Token: tok} }
	onA, onB, onC := as(a, alice), as(b, alice), as(c, alice)
	mallory := as(b, tokenFor(t, "mallory", time.Now().Add(time.Hour), allRooms))
	_, next := watchKeys(t, dial(t, c, &client.Options{Token: alice}), room)

	id, err := onA.GrantLease(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := onB.Put(ctx, room, "games/1", json.RawMessage(`1`), nil, id); err != nil {
		t.Fatalf("put under a lease granted by another node: %v", err)
	}
	if got := next(); !slices.Equal(got, []string{"put:games/1"}) {
		t.Fatalf("events %v, want the put", got)
	}
	// Node a, which granted it, stops; keep-alives through b and c keep
	// the lease past three TTLs.
	a.Stop()
	for i := range 9 {
		time.Sleep(ttl / 3)
		if err := []*client.HTTP{onB, onC}[i%2].KeepAlive(ctx, id); err != nil {
			t.Fatalf("keep-alive %d through another node: %v", i, err)
		}
	}
	if _, err := onC.Put(ctx, room, "games/2", json.RawMessage(`2`), nil, id); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{"put:games/2"}) {
		t.Fatalf("events %v, want only games/2's put: the lease outlived its TTL and its granting node", got)
	}
	// Only its subject may use it, on any node.
	for what, err := range map[string]error{
		"keep-alive": mallory.KeepAlive(ctx, id),
		"revoke":     mallory.Revoke(ctx, id),
		"put":        func() error { _, err := mallory.Put(ctx, room, "x", json.RawMessage(`1`), nil, id); return err }(),
	} {
		if !errors.Is(err, client.ErrForbidden) {
			t.Errorf("%s by another subject: %v, want forbidden", what, err)
		}
	}
	// Revoked through node c: its keys are gone when the revoke returns.
	if err := onC.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	l, err := onB.List(ctx, room, "games/")
	if err != nil || len(l.Items) != 0 {
		t.Fatalf("after the revoke: %v items (%v), want none", l.Items, err)
	}
	if got := append(next(), next()...); !slices.Equal(sorted(got), []string{"delete:games/1", "delete:games/2"}) {
		t.Fatalf("events %v, want both keys deleted", got)
	}
	if err := onB.KeepAlive(ctx, id); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("keep-alive of a revoked lease: %v, want not found", err)
	}

	// A lease left alone ends after its TTL: its key is deleted once,
	// though two nodes race to end it.
	id2, err := onB.GrantLease(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := onC.Put(ctx, room, "games/3", json.RawMessage(`3`), nil, id2); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{"put:games/3"}) {
		t.Fatalf("events %v, want games/3's put", got)
	}
	start := time.Now()
	if got := next(); !slices.Equal(got, []string{"delete:games/3"}) {
		t.Fatalf("events %v, want games/3 deleted when its lease ended", got)
	}
	if took, bound := time.Since(start), ttl+2*time.Second; took > bound {
		t.Errorf("the key was deleted %v after its write, want within %v", took, bound)
	}
	time.Sleep(timeout)
	if _, err := onB.Put(ctx, room, "marker", json.RawMessage(`1`), nil, ""); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{"put:marker"}) {
		t.Fatalf("events %v, want only the marker: one delete per key", got)
	}

	// Half-done ends, as a node that died leaves them: a key written
	// under a lease that ended before the key was listed, and a lease
	// taken out of the store whose keys were never deleted. The orphan
	// sweep of the live nodes ends both.
	ghost, err := redisstore.New(ctx, redisstore.Config{URL: rs.URL(), Prefix: "tl"})
	if err != nil {
		t.Fatal(err)
	}
	defer ghost.Close()
	res, err := ghost.Apply(ctx, room, store.Write{Ops: []store.Op{
		{Type: store.OpPut, Key: "games/unlisted", Value: []byte(`1`), Lease: "ttl_gone"},
		{Type: store.OpPut, Key: "games/ended", Value: []byte(`1`), Lease: "ttl_ended"}}})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := ghost.GrantLease(ctx, "ttl_ended", "alice", 100*time.Millisecond, 10); !ok || err != nil {
		t.Fatalf("grant: %v %v", ok, err)
	}
	if ok, err := ghost.AttachLease(ctx, "ttl_ended", store.LeaseKey{Room: room, Key: "games/ended", ModRev: res.Rev}); !ok || err != nil {
		t.Fatalf("attach: %v %v", ok, err)
	}
	// The ghost takes the lease out of the store the moment it is due,
	// racing the live nodes, which may win.
	waitFor(t, 5*time.Second, "the lease to end", func() bool {
		st, _ := ghost.Lease(ctx, "ttl_ended")
		_, _ = ghost.EndDueLeases(ctx, 10)
		return !st.Alive
	})
	if got := next(); !slices.Equal(got, []string{"put:games/ended", "put:games/unlisted"}) && !slices.Equal(got, []string{"put:games/unlisted", "put:games/ended"}) {
		t.Fatalf("events %v, want the ghost's puts", got)
	}
	if got := append(next(), next()...); !slices.Equal(sorted(got), []string{"delete:games/ended", "delete:games/unlisted"}) {
		t.Fatalf("events %v, want both orphaned keys deleted", got)
	}
}

func sorted(s []string) []string { slices.Sort(s); return s }

// TestTTLLeaseAnonymousAcrossNodes: without auth every client is the
// anonymous subject (""), a holder like any other on Redis too.
func TestTTLLeaseAnonymousAcrossNodes(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	rs := redistest.Start(t, redistest.Options{})
	ctx := servertest.Context(t)
	node := func(id string) *servertest.Node {
		return redisNode(t, rs.URL(), "ta", server.Config{NodeID: id, NodeTimeout: time.Second})
	}
	a, b := node("a"), node("b")
	id, err := a.HTTP.GrantLease(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.HTTP.KeepAlive(ctx, id); err != nil {
		t.Fatalf("keep-alive through another node: %v", err)
	}
	if _, err := b.HTTP.Put(ctx, "r", "k", json.RawMessage(`1`), nil, id); err != nil {
		t.Fatalf("put under the lease through another node: %v", err)
	}
	if err := a.HTTP.Revoke(ctx, id); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	if l, err := b.HTTP.List(ctx, "r", ""); err != nil || len(l.Items) != 0 {
		t.Fatalf("after the revoke: %v (%v), want no key", l.Items, err)
	}
}

// redisNode starts a node on the Redis at url, under key prefix, with cfg.
func redisNode(t *testing.T, url, prefix string, cfg server.Config) *servertest.Node {
	t.Helper()
	st, err := redisstore.New(servertest.Context(t), redisstore.Config{URL: url, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return servertest.Start(t, servertest.Options{Store: st, Server: cfg})
}
