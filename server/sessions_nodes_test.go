package server_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redisstore"
	"github.com/statecast/statecast/store/redistest"
)

// failingScans is a Redis store whose full scans of the leased keys
// (Leased) fail once failing is set: a node whose link to Redis is too
// slow for a scan to finish within the sweep's minute, while its beats
// (small and frequent) still get through.
type failingScans struct {
	*redisstore.Store
	failing atomic.Bool
}

func (f *failingScans) Leased(ctx context.Context, fn func(room string, kv store.KV) error) error {
	if f.failing.Load() {
		return errors.New("scan timed out")
	}
	return f.Store.Leased(ctx, fn)
}

// TestOrphanSweepSurvivesOneSlowNode: a key whose session record is gone
// (its ender died before deleting it) is deleted by an orphan sweep even
// when one node cannot finish its scans: the others sweep too. (A sweep
// on one elected node only was tried, 8697799, and left such keys for
// good when that node's scans failed.)
func TestOrphanSweepSurvivesOneSlowNode(t *testing.T) {
	t.Parallel() // waits on wall-clock time (sweep periods)
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	const timeout = 400 * time.Millisecond // a sweep every 25 ticks of 100 ms: 2.5 s
	open := storeOpener(t, ctx, rs.URL(), "sl")
	slow := &failingScans{Store: open()}
	servertest.Start(t, servertest.Options{Store: slow, Server: server.Config{NodeID: "a", NodeTimeout: timeout, LeaseGrace: 200 * time.Millisecond}})
	slow.failing.Store(true) // after its start-up recovery
	b := servertest.Start(t, servertest.Options{Store: open(), Server: server.Config{NodeID: "b", NodeTimeout: timeout, LeaseGrace: 200 * time.Millisecond}})

	ghost := open()
	defer ghost.Close()
	if _, err := ghost.Apply(ctx, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "orphan", Value: []byte(`1`), Lease: "session:s_gone"}}}); err != nil {
		t.Fatal(err)
	}
	// three sweep periods
	waitFor(t, 3*25*timeout/5, "an orphan sweep while node a, the only one that may sweep, cannot scan", roomEmpty(ctx, b, room))
}

// lateClaims is a Redis store on which no claim of a stale node wins: as
// if each such node beat again just before the claim (a node late in a
// reconnect storm, not dead).
type lateClaims struct{ *redisstore.Store }

func (lateClaims) Claim(context.Context, string, time.Duration) (bool, error) { return false, nil }

// TestOrphanSweepsLeaveALateNodeAlone: a node whose beats are late
// (stale in the registry) but that no claim took keeps its sessions and
// its keys through the orphan sweeps and a node's start: they are for
// what nodes gone from the registry left. (They took a stale node for
// gone: its sessions' grace started unknown to it, and its clients'
// session-bound and connection-bound keys were deleted while they were
// connected to it.) Once it is gone from the registry, the sweeps end
// what it left.
func TestOrphanSweepsLeaveALateNodeAlone(t *testing.T) {
	t.Parallel() // waits on wall-clock time (sweep periods, grace)
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	const timeout = 400 * time.Millisecond // a sweep every 25 ticks of 100 ms: 2.5 s
	open := storeOpener(t, ctx, rs.URL(), "ln")
	late := open() // the late node: it beats once, then not in time
	defer late.Close()
	if _, err := late.Beat(ctx, "late.1"); err != nil {
		t.Fatal(err)
	}
	if err := late.SaveSession(ctx, store.SessionRecord{ID: "s_1", Subject: "u", ResumeHash: make([]byte, 32), Lease: "session:s_1", Owner: "late.1"}); err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"in-session", "session:s_1"}, {"on-connection", "late.1/c_1"}} {
		if _, err := late.Apply(ctx, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: kv[0], Value: []byte(`1`), Lease: kv[1]}}}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(timeout) // stale from here on
	e := servertest.Start(t, servertest.Options{Store: lateClaims{open()}, Server: server.Config{NodeID: "a", NodeTimeout: timeout, LeaseGrace: 200 * time.Millisecond}})
	time.Sleep(3 * 25 * timeout / 5) // three sweep periods
	if rec, ok, err := late.Session(ctx, "s_1"); err != nil || !ok || rec.Deadline != 0 {
		t.Fatalf("the late node's session: %+v %v %v, want it attached (no deadline)", rec, ok, err)
	}
	if l, err := e.HTTP.List(ctx, room, ""); err != nil || len(l.Items) != 2 {
		t.Fatalf("the late node's keys: %+v %v, want both", l, err)
	}
	// A claim (on a store where it wins) takes it out of the registry.
	if won, err := late.Claim(ctx, "late.1", timeout); err != nil || !won {
		t.Fatalf("claim: %v %v", won, err)
	}
	waitFor(t, 3*25*timeout/5+2*time.Second, "the sweeps to end what the gone node left", roomEmpty(ctx, e, room))
}

// TestSessionKeyOfAnotherNodeEndsWithSession: a key bound to a session
// by another node (here written straight to the store, as a node of a
// previous version would) is deleted when its session ends, not one
// orphan-sweep period (5 node timeouts: 50 s by default) later.
func TestSessionKeyOfAnotherNodeEndsWithSession(t *testing.T) {
	t.Parallel() // waits on wall-clock time (grace, ticks)
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	const timeout = 2 * time.Second // ends every 400 ms; orphan sweeps every 10 s
	open := storeOpener(t, ctx, rs.URL(), "ul")
	e := servertest.Start(t, servertest.Options{Store: open(), Server: server.Config{NodeID: "a", NodeTimeout: timeout, LeaseGrace: 200 * time.Millisecond}})
	ghost := open() // the node of the previous version
	defer ghost.Close()
	end := time.Now().Add(300 * time.Millisecond)
	if err := ghost.SaveSession(ctx, store.SessionRecord{ID: "s_1", Subject: "u", ResumeHash: make([]byte, 32), Lease: "session:s_1", Deadline: end.UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	if _, err := ghost.Apply(ctx, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "presence/u", Value: []byte(`1`), Lease: "session:s_1"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the session to end", func() bool {
		_, ok, err := ghost.Session(ctx, "s_1")
		return err == nil && !ok
	})
	waitFor(t, 2*time.Second, "the key of the ended session to be deleted", roomEmpty(ctx, e, room))
}

// storeOpener opens Redis stores on url under prefix, as the nodes of
// one cluster (and a ghost of a node that is gone) share one.
func storeOpener(t *testing.T, ctx context.Context, url, prefix string) func() *redisstore.Store {
	return func() *redisstore.Store {
		st, err := redisstore.New(ctx, redisstore.Config{URL: url, Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
}

// roomEmpty reports whether room has no key, read through node n.
func roomEmpty(ctx context.Context, n *servertest.Node, room string) func() bool {
	return func() bool {
		l, err := n.HTTP.List(ctx, room, "")
		return err == nil && len(l.Items) == 0
	}
}

// scanCounter is a Redis store that counts its full scans of the rooms'
// leased keys (Leased).
type scanCounter struct {
	*redisstore.Store
	scans atomic.Int32
}

func (c *scanCounter) Leased(ctx context.Context, fn func(room string, kv store.KV) error) error {
	c.scans.Add(1)
	return c.Store.Leased(ctx, fn)
}

// TestSessionEndsWithoutScan: the keys of a shared session are listed
// beside its record, so the node that ends it (here the other one)
// deletes them without scanning every room's keys, as it did before.
func TestSessionEndsWithoutScan(t *testing.T) {
	t.Parallel() // waits on wall-clock time (grace)
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	const grace = 200 * time.Millisecond
	var counters []*scanCounter
	node := func(id string) *servertest.Node {
		st, err := redisstore.New(ctx, redisstore.Config{URL: rs.URL(), Prefix: "se"})
		if err != nil {
			t.Fatal(err)
		}
		c := &scanCounter{Store: st}
		counters = append(counters, c)
		// Due sessions end every second; orphan sweeps every 25 s, after the test.
		return servertest.Start(t, servertest.Options{Store: c, Server: server.Config{NodeID: id, NodeTimeout: 5 * time.Second, LeaseGrace: grace}})
	}
	a, b := node("a"), node("b")
	_, next := watchKeys(t, dialCodec(t, b, "json"), room)
	scans := func() (n int32) {
		for _, c := range counters {
			n += c.scans.Load()
		}
		return n
	}
	before := scans() // each node's start-up recovery scans once
	ca := dialCodec(t, a, "json")
	for _, k := range []string{"x", "y", "x"} {
		if _, err := ca.Put(ctx, room, k, 1, client.WithLease("session")); err != nil {
			t.Fatal(err)
		}
	}
	ca.CloseNow()
	var got []string
	for len(got) < 5 {
		got = append(got, next()...)
	}
	if want := []string{"put:x", "put:y", "put:x", "delete:x", "delete:y"}; !slices.Equal(got[:3], want[:3]) || !slices.Equal(sorted(got[3:]), want[3:]) {
		t.Fatalf("events %v, want %v (the deletes in any order)", got, want)
	}
	if n := scans() - before; n != 0 {
		t.Errorf("ending the session scanned the rooms %d times, want 0", n)
	}
}

// listCounter is a Redis store that counts its session key listings.
type listCounter struct {
	*redisstore.Store
	lists atomic.Int32
}

func (c *listCounter) ListSessionKey(ctx context.Context, id, room, key string) (store.Listing, error) {
	c.lists.Add(1)
	return c.Store.ListSessionKey(ctx, id, room, key)
}

// TestSessionKeyListedOnce: a key a session writes again and again (a
// cursor) is listed once by the node the session is on, not once a
// write: presence traffic costs Redis no second call per write.
func TestSessionKeyListedOnce(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "board"
	st := redisAt(t, rs, "lo")
	c := &listCounter{Store: st}
	e := servertest.Start(t, servertest.Options{Store: c, Server: server.Config{NodeID: "a"}})
	cl := dialCodec(t, e, "json")
	for i := range 50 {
		for _, k := range []string{"cursor", "name"} {
			if _, err := cl.Put(ctx, room, k, i, client.WithLease("session")); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, 5*time.Second, "both keys listed", func() bool { return c.lists.Load() >= 2 })
	time.Sleep(100 * time.Millisecond) // any late listing
	if n := c.lists.Load(); n != 2 {
		t.Errorf("100 writes of 2 keys under one session listed %d times, want 2", n)
	}
}

// lostTakes is a Redis store whose session takes, while lose is set, run
// but answer an error: the reply of a resume lost on its way back.
type lostTakes struct {
	*redisstore.Store
	lose atomic.Bool
}

func (l *lostTakes) TakeSession(ctx context.Context, id, subject string, old, new []byte, node string, read time.Time) (store.SessionRecord, string, bool, error) {
	rec, prev, ok, err := l.Store.TakeSession(ctx, id, subject, old, new, node, read)
	if l.lose.Load() {
		return store.SessionRecord{}, "", false, errors.New("i/o timeout")
	}
	return rec, prev, ok, err
}

// TestResumeAfterALostTake: a resume whose take ran in Redis but whose
// reply was lost closes the socket (1011) rather than opening a new
// session (which would let the client's keys end with the old one); the
// client's next resume with the same secret gets its session back, keys
// included. A client that never comes back after such a take: its
// session, attached in the store to a node where no connection holds it,
// starts its grace and ends, and its key goes.
func TestResumeAfterALostTake(t *testing.T) {
	t.Parallel() // waits on wall-clock time (grace, ticks)
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	cfg := server.Config{NodeTimeout: time.Second, LeaseGrace: 2 * time.Second}
	open := storeOpener(t, ctx, rs.URL(), "lt")
	cfg.NodeID = "a"
	a := servertest.Start(t, servertest.Options{Store: open(), Server: cfg})
	lossy := &lostTakes{Store: open()}
	cfg.NodeID = "b"
	b := servertest.Start(t, servertest.Options{Store: lossy, Server: cfg})

	c := dial(t, a, nil)
	if _, err := c.Put(ctx, room, "presence/u", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	first := c.Connected()
	_ = c.Close()

	lossy.lose.Store(true)
	if c, err := client.Dial(ctx, b.WS, &client.Options{Session: first.Session, Resume: first.Resume}); err == nil {
		_ = c.Close()
		t.Fatal("a resume whose take got no answer: connected, want the socket closed (1011)")
	}
	lossy.lose.Store(false)
	c = dial(t, b, &client.Options{Session: first.Session, Resume: first.Resume})
	again := c.Connected()
	if !again.Resumed || again.Session != first.Session {
		t.Fatalf("the resume after a lost take: %+v, want session %s resumed", again, first.Session)
	}
	if l, err := a.HTTP.List(ctx, room, ""); err != nil || len(l.Items) != 1 {
		t.Fatalf("the session's key after the resume: %+v, %v", l, err)
	}
	_ = c.Close()

	// Lost again, and the client never returns.
	lossy.lose.Store(true)
	if c, err := client.Dial(ctx, b.WS, &client.Options{Session: again.Session, Resume: again.Resume}); err == nil {
		_ = c.Close()
		t.Fatal("a resume whose take got no answer: connected")
	}
	lossy.lose.Store(false)
	waitFor(t, 10*time.Second, "the session of a lost take, never resumed, to end and its key to go", roomEmpty(ctx, a, room))
}

// stalledSessions is a Redis store whose session saves and detaches fail
// without running while failSave or failDetach is set (a queue to Redis
// that did not drain in time), and whose takes, while slowTake is set,
// run and then take that long to answer (a node too busy to read the
// reply at once). It counts the detaches.
type stalledSessions struct {
	*redisstore.Store
	failSave, failDetach atomic.Bool
	stallReads           atomic.Bool  // Session answers only when its ctx ends
	slowTake             atomic.Int64 // ns
	slowDetach           atomic.Int64 // ns
	detaches, reads      atomic.Int32
}

func (s *stalledSessions) Session(ctx context.Context, id string) (store.SessionRecord, bool, error) {
	s.reads.Add(1)
	if s.stallReads.Load() {
		<-ctx.Done()
		return store.SessionRecord{}, false, fmt.Errorf("%w: %v", store.ErrUnavailable, ctx.Err())
	}
	return s.Store.Session(ctx, id)
}

func (s *stalledSessions) SaveSession(ctx context.Context, rec store.SessionRecord) error {
	if s.failSave.Load() {
		return fmt.Errorf("%w: redis write to a record not sent: context deadline exceeded", store.ErrUnavailable)
	}
	return s.Store.SaveSession(ctx, rec)
}

func (s *stalledSessions) DetachSession(ctx context.Context, id string, gen int64, grace time.Duration) (bool, error) {
	s.detaches.Add(1)
	if s.failDetach.Load() {
		return false, fmt.Errorf("%w: redis: connection pool timeout", store.ErrUnavailable)
	}
	time.Sleep(time.Duration(s.slowDetach.Load()))
	return s.Store.DetachSession(ctx, id, gen, grace)
}

func (s *stalledSessions) TakeSession(ctx context.Context, id, subject string, old, new []byte, node string, read time.Time) (store.SessionRecord, string, bool, error) {
	rec, prev, ok, err := s.Store.TakeSession(ctx, id, subject, old, new, node, read)
	time.Sleep(time.Duration(s.slowTake.Load()))
	return rec, prev, ok, err
}

// TestUnsureSessionResumedHereStays: a session whose detach got no
// answer is unsure (the sweeper starts its grace if the store still
// holds it attached here with nobody connected). Its client resumes it on
// the same node; the sweeper's read lands between the take and the
// session's registration here. It must not start the grace of the
// session being taken: it did, and 2 s later the session of a connected
// client ended, its key with it (one of the scale run's missing keys).
func TestUnsureSessionResumedHereStays(t *testing.T) {
	t.Parallel() // waits on wall-clock time (grace, ticks)
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	const grace = 2 * time.Second
	st := redisAt(t, rs, "us")
	stalled := &stalledSessions{Store: st}
	// The sweeper settles the unsure every 100 ms.
	n := servertest.Start(t, servertest.Options{Store: stalled, Server: server.Config{NodeID: "a", NodeTimeout: 500 * time.Millisecond, LeaseGrace: grace}})

	c := dial(t, n, nil)
	if _, err := c.Put(ctx, room, "presence/u", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	first := c.Connected()
	stalled.failDetach.Store(true)
	_ = c.Close()
	time.Sleep(300 * time.Millisecond) // the detach failed; the sweeper's tries too

	stalled.failDetach.Store(false)
	stalled.slowTake.Store(int64(time.Second)) // ten sweeper ticks
	c = dial(t, n, &client.Options{Session: first.Session, Resume: first.Resume})
	defer c.Close()
	if got := c.Connected(); !got.Resumed {
		t.Fatalf("the resume: %+v, want resumed", got)
	}
	time.Sleep(grace + time.Second) // past the grace of a wrongly started one, and its end
	rec, ok, err := st.Session(ctx, first.Session)
	if err != nil || !ok || rec.Deadline != 0 {
		t.Fatalf("the record of the resumed session: %+v, %v, %v; want it attached", rec, ok, err)
	}
	if l, err := n.HTTP.List(ctx, room, ""); err != nil || len(l.Items) != 1 {
		t.Fatalf("the key of the connected session: %+v, %v; want it kept", l, err)
	}
}

// TestShutdownWithUnsureSessionsAndAStoreNotAnswering: sessions whose
// detach got no answer are unsure, and the sweeper reads each to settle
// it. With the store not answering, neither a sweep nor a shutdown may
// wait for a read of each: after a connect storm left thousands unsure
// and Redis went, stopped nodes ran on for minutes.
func TestShutdownWithUnsureSessionsAndAStoreNotAnswering(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	st := redisAt(t, rs, "sd")
	stalled := &stalledSessions{Store: st}
	const timeout = time.Second
	n := servertest.Start(t, servertest.Options{Store: stalled, Server: server.Config{NodeID: "a", StoreTimeout: timeout}})
	stalled.failDetach.Store(true)
	const unsure = 20
	for range unsure {
		_ = dial(t, n, nil).Close()
	}
	waitFor(t, 5*time.Second, "the failed detaches", func() bool { return stalled.detaches.Load() >= unsure })
	stalled.stallReads.Store(true)
	r0 := stalled.reads.Load()
	time.Sleep(3 * timeout)
	// One read a round is tried; it times out, and the round ends. A tick
	// is 100 ms here, so at most one round starts per timeout.
	if r := stalled.reads.Load() - r0; r > 4 {
		t.Errorf("%d reads of unsure sessions in %v with the store not answering (each a %v timeout), want at most one a round", r, 3*timeout, timeout)
	}
	start := time.Now()
	n.Stop()
	if d := time.Since(start); d > timeout {
		t.Errorf("the shutdown took %v with %d unsure sessions and the store not answering; want it not to wait for their reads (%v each)", d, unsure, timeout)
	}
}

// TestShutdownStartsEveryGrace: a node that shuts down starts the grace
// of every session attached to it within one store timeout, though each
// detach takes a while: one after another, a node's 20,000 ran past the
// timeout in a rolling restart's reconnect storm, leaving the rest to
// the others' scan of every session once the node was found dead.
func TestShutdownStartsEveryGrace(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	ctx := servertest.Context(t)
	st := redisAt(t, rs, "sg")
	stalled := &stalledSessions{Store: st}
	const timeout, each, sessions = time.Second, 50 * time.Millisecond, 60 // 3 s one after another
	n := servertest.Start(t, servertest.Options{Store: stalled, Server: server.Config{NodeID: "a", StoreTimeout: timeout}})
	ids := make([]string, sessions)
	for i := range ids {
		ids[i] = dial(t, n, nil).Connected().Session
	}
	stalled.slowDetach.Store(int64(each))
	n.Stop() // closes st
	reader := redisAt(t, rs, "sg")
	defer reader.Close()
	for _, id := range ids {
		rec, ok, err := reader.Session(ctx, id)
		if err != nil || !ok || rec.Deadline == 0 {
			t.Fatalf("session %s after the shutdown: %+v, %v, %v; want its grace started (a deadline)", id, rec, ok, err)
		}
	}
}

// TestFailedDetachesAreCountedNotLoggedEach: when many clients leave at
// once and the store does not take their detaches, the node logs the
// first and then how many more, not a line per session (100,000 clients
// closing together logged 12,014 lines).
func TestFailedDetachesAreCountedNotLoggedEach(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	st := redisAt(t, rs, "fd")
	stalled := &stalledSessions{Store: st}
	var logs syncBuffer
	n := servertest.Start(t, servertest.Options{Store: stalled, Server: server.Config{NodeID: "a",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}})
	stalled.failDetach.Store(true)
	const leaving = 30
	for range leaving {
		_ = dial(t, n, nil).Close()
	}
	waitFor(t, 5*time.Second, "the failed detaches", func() bool { return stalled.detaches.Load() >= leaving })
	const each, more = "cannot start a session's grace in the store", "cannot start the grace of more sessions"
	counted := func() int {
		total := 0
		for line := range strings.Lines(logs.String()) {
			switch {
			case strings.Contains(line, each):
				total++
			case strings.Contains(line, more):
				i := strings.Index(line, "sessions=")
				k, _ := strconv.Atoi(strings.Fields(line[i+len("sessions="):])[0])
				total += k
			}
		}
		return total
	}
	// The sweeper (a tick of 100 ms here) reports the count.
	waitFor(t, 5*time.Second, "every failed detach logged or counted", func() bool { return counted() >= leaving })
	lines := strings.Count(logs.String(), each) + strings.Count(logs.String(), more)
	if lines > 10 {
		t.Errorf("%d log lines for %d failed detaches, want the first and counts:\n%s", lines, leaving, logs.String())
	}
}

// TestUnsentSessionSaveNeedsNoDetach: a connect whose session record was
// not sent (the store's queue did not drain in time) closes 1011 and
// costs the store nothing more: its socket's close sends no detach of a
// record that does not exist (in a connect burst, one more round trip for
// every refused connect, while the store was already behind).
func TestUnsentSessionSaveNeedsNoDetach(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	st := redisAt(t, rs, "un")
	stalled := &stalledSessions{Store: st}
	n := servertest.Start(t, servertest.Options{Store: stalled, Server: server.Config{NodeID: "a"}})
	stalled.failSave.Store(true)
	r := dialRaw(t, n, "json")
	r.send(&wire.Request{T: wire.TConnect})
	if code, msgs := r.closeStatus(5 * time.Second); code != websocket.StatusInternalError || len(msgs) > 0 {
		t.Fatalf("a connect whose session was not saved: closed %d after %v, want 1011 and nothing", code, msgs)
	}
	time.Sleep(200 * time.Millisecond) // a detach is sent at once, by its own goroutine
	if d := stalled.detaches.Load(); d != 0 {
		t.Errorf("the refused connect's close sent %d detaches, want none", d)
	}
}

// sweepLog is a Redis store that notes when its node calls what only an
// orphan sweep calls: SessionOwners (sessions; also once at start),
// EndedLeaseKeys (TTL leases) and Leased (each of the three sweeps, the
// node leases' included; also once at start).
type sweepLog struct {
	*redisstore.Store
	calls *sweepCalls
}

type sweepCalls struct {
	mu sync.Mutex
	at map[string][]time.Time // by call
}

func (c *sweepCalls) note(call string) {
	c.mu.Lock()
	c.at[call] = append(c.at[call], time.Now())
	c.mu.Unlock()
}

// since returns the times of call after t, in order.
func (c *sweepCalls) since(call string, t time.Time) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Time
	for _, at := range c.at[call] {
		if at.After(t) {
			out = append(out, at)
		}
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

func (s *sweepLog) SessionOwners(ctx context.Context) ([]string, error) {
	s.calls.note("SessionOwners")
	return s.Store.SessionOwners(ctx)
}

func (s *sweepLog) EndedLeaseKeys(ctx context.Context, max int) (map[string][]store.LeaseKey, error) {
	s.calls.note("EndedLeaseKeys")
	return s.Store.EndedLeaseKeys(ctx, max)
}

func (s *sweepLog) Leased(ctx context.Context, fn func(room string, kv store.KV) error) error {
	s.calls.note("Leased")
	return s.Store.Leased(ctx, fn)
}

// TestOrphanSweepsTakeTurns: of three nodes, one runs each orphan sweep
// an interval (5 node timeouts), not each of them (three full scans a
// node every interval cost a cluster of 100,000 sessions 12-16 % of a
// core on every node); when the node that took the sessions' turn stops,
// another takes it once it expires, and an orphaned key still goes.
func TestOrphanSweepsTakeTurns(t *testing.T) {
	t.Parallel() // waits on wall-clock time (sweep periods)
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	const timeout = 400 * time.Millisecond // ticks of 100 ms; a sweep every 25: 2.5 s
	const interval = 25 * 100 * time.Millisecond
	calls := &sweepCalls{at: make(map[string][]time.Time)}
	open := storeOpener(t, ctx, rs.URL(), "tt")
	nodes := make(map[string]*servertest.Node)
	for _, id := range []string{"a", "b", "c"} {
		nodes[id] = servertest.Start(t, servertest.Options{Store: &sweepLog{Store: open(), calls: calls},
			Server: server.Config{NodeID: id, NodeTimeout: timeout, LeaseGrace: 200 * time.Millisecond}})
	}
	time.Sleep(interval / 10) // each node's start-up release (a scan is in New)
	started := time.Now()
	time.Sleep(3*interval + interval/2)
	for _, call := range []string{"SessionOwners", "EndedLeaseKeys"} {
		at := calls.since(call, started)
		if len(at) < 2 || len(at) > 4 {
			t.Errorf("%s called %d times in 3.5 sweep intervals by 3 nodes, want 2 to 4 (one sweep an interval)", call, len(at))
		}
		for i := 1; i < len(at); i++ {
			if gap := at[i].Sub(at[i-1]); gap < interval/2 {
				t.Errorf("two %s sweeps %v apart, want one an interval (%v)", call, gap, interval)
			}
		}
	}
	if n := len(calls.since("Leased", started)); n > 3*4 {
		t.Errorf("%d scans of the leased keys in 3.5 sweep intervals, want at most 12 (3 sweeps an interval, one node each)", n)
	}

	// The node holding the sessions' turn stops; an orphan written
	// after goes within two intervals (the turn expires, another node
	// takes it).
	holder, err := redistest.Do(rs.Addr(), "GET", "tt:turn:sessions")
	if err != nil || holder == "" {
		t.Fatalf("the sessions' turn: %q, %v", holder, err)
	}
	id, _, _ := strings.Cut(holder, ".")
	nodes[id].Stop()
	delete(nodes, id)
	ghost := open()
	defer ghost.Close()
	if _, err := ghost.Apply(ctx, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "orphan", Value: []byte(`1`), Lease: "session:s_gone"}}}); err != nil {
		t.Fatal(err)
	}
	var rest *servertest.Node
	for _, n := range nodes {
		rest = n
	}
	waitFor(t, 2*interval+5*time.Second, "the orphan deleted after the turn's holder stopped", roomEmpty(ctx, rest, room))
	if now, err := redistest.Do(rs.Addr(), "GET", "tt:turn:sessions"); err != nil || now == holder || nodes[strings.Split(now, ".")[0]] == nil {
		t.Errorf("the sessions' turn after its holder %s stopped: %q, %v; want another node's", holder, now, err)
	}
}

// slowBeats is a Redis store whose beats, once delay is set, are
// answered only after it (or fail when their context ends first): a node
// too busy to read them.
type slowBeats struct {
	*redisstore.Store
	delay atomic.Int64 // ns
}

func (s *slowBeats) Beat(ctx context.Context, node string) (store.BeatResult, error) {
	select {
	case <-time.After(time.Duration(s.delay.Load())):
	case <-ctx.Done():
		return store.BeatResult{}, ctx.Err()
	}
	return s.Store.Beat(ctx, node)
}

// TestSlowBeatsKeepANodeAlive: a node whose beats take longer than the
// beat interval, though well within the node timeout, stays registered
// alive: in a storm a restarted node's beats were given up after one
// interval, the others claimed it, and it closed all the clients it had
// just taken (twice in a minute).
func TestSlowBeatsKeepANodeAlive(t *testing.T) {
	t.Parallel() // waits on wall-clock time (node timeouts)
	rs := redistest.Start(t, redistest.Options{})
	ctx := servertest.Context(t)
	const timeout = time.Second // a beat every 200 ms
	open := storeOpener(t, ctx, rs.URL(), "sb")
	slow := &slowBeats{Store: open()}
	servertest.Start(t, servertest.Options{Store: slow, Server: server.Config{NodeID: "a", NodeTimeout: timeout}})
	const delay = 300 * time.Millisecond
	slow.delay.Store(int64(delay)) // after its start-up registration
	servertest.Start(t, servertest.Options{Store: open(), Server: server.Config{NodeID: "b", NodeTimeout: timeout}})
	reg := open()
	defer reg.Close()
	for end := time.Now().Add(4 * timeout); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		alive, stale, err := reg.Registered(ctx, timeout)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(alive, func(n string) bool { return strings.HasPrefix(n, "a.") }) {
			t.Fatalf("node a, whose beats take %v of its %v timeout, is not alive in the registry (alive %v, stale %v)", delay, timeout, alive, stale)
		}
	}
}

// hungRegistry is a Redis store whose registry reads, once hang is set,
// are answered only when their context ends (Redis too busy to answer
// them in time); it records when each beat was answered.
type hungRegistry struct {
	*redisstore.Store
	hang  atomic.Bool
	mu    sync.Mutex
	beats []time.Time
}

func (s *hungRegistry) Registered(ctx context.Context, timeout time.Duration) (alive, stale []string, err error) {
	if s.hang.Load() {
		<-ctx.Done()
		return nil, nil, ctx.Err()
	}
	return s.Store.Registered(ctx, timeout)
}

func (s *hungRegistry) Beat(ctx context.Context, node string) (store.BeatResult, error) {
	added, err := s.Store.Beat(ctx, node)
	if err == nil {
		s.mu.Lock()
		s.beats = append(s.beats, time.Now())
		s.mu.Unlock()
	}
	return added, err
}

// TestHungRegistryReadsDoNotDelayBeats: a node whose reads of the node
// registry take as long as they may still beats every interval. When the
// read came between two beats, each hung read put a beat off by half the
// node timeout; with slow beats as well, a live node's beats landed more
// than the node timeout apart in a reconnect storm, and the others took
// it for dead.
func TestHungRegistryReadsDoNotDelayBeats(t *testing.T) {
	t.Parallel() // waits on wall-clock time (beat intervals)
	rs := redistest.Start(t, redistest.Options{})
	st := redisAt(t, rs, "hr")
	const timeout = 2500 * time.Millisecond // a beat every 500 ms; a read may take 1.25 s
	hung := &hungRegistry{Store: st}
	servertest.Start(t, servertest.Options{Store: hung, Server: server.Config{NodeID: "a", NodeTimeout: timeout}})
	hung.hang.Store(true) // after its start-up registration
	time.Sleep(4 * time.Second)
	hung.mu.Lock()
	beats := slices.Clone(hung.beats)
	hung.mu.Unlock()
	var worst time.Duration
	for i := 1; i < len(beats); i++ {
		worst = max(worst, beats[i].Sub(beats[i-1]))
	}
	if len(beats) < 5 || worst >= time.Second {
		t.Errorf("%d beats in 4 s, at most %v apart, with the registry reads hanging; want one every 500 ms (under 1 s apart)", len(beats), worst)
	}
}

// heldTakes is a Redis store whose session take-overs wait, once held is
// set, until release is closed (or their context ends).
type heldTakes struct {
	*redisstore.Store
	held    atomic.Bool
	waiting chan struct{} // gets a value when a take starts waiting
	release chan struct{}
	landed  atomic.Int32 // held takes that ran since
}

func (h *heldTakes) TakeSession(ctx context.Context, id, subject string, old, new []byte, node string, read time.Time) (store.SessionRecord, string, bool, error) {
	if h.held.Load() {
		h.waiting <- struct{}{}
		select {
		case <-h.release:
		case <-ctx.Done():
			return store.SessionRecord{}, "", false, fmt.Errorf("%w: %v", store.ErrUnavailable, ctx.Err())
		}
		defer h.landed.Add(1)
	}
	return h.Store.TakeSession(ctx, id, subject, old, new, node, read)
}

// TestFencedNodeAnswersTheTakeInFlight: a node taken for dead closes its
// sockets (1012), but a connect whose session take-over is on its way to
// the store is answered first. Closed before, its client resumed on
// another node with the secret the take replaces, and the take, landing
// after that node's, left the client a secret the store no longer held:
// in a 100,000-client storm four resumes came back as new sessions, and
// the old sessions' keys were deleted after their grace.
func TestFencedNodeAnswersTheTakeInFlight(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	ctx := servertest.Context(t)
	st := redisAt(t, rs, "ft")
	held := &heldTakes{Store: st, waiting: make(chan struct{}, 1), release: make(chan struct{})}
	var logs syncBuffer
	n := servertest.Start(t, servertest.Options{Store: held, Server: server.Config{NodeID: "a", NodeTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}})
	first := dial(t, n, nil).Connected()
	held.held.Store(true)

	type dialed struct {
		c   *client.Conn
		err error
	}
	resumed := make(chan dialed, 1)
	go func() {
		c, err := client.Dial(ctx, n.WS, &client.Options{Session: first.Session, Resume: first.Resume})
		resumed <- dialed{c, err}
	}()
	select {
	case <-held.waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the resume's take-over never reached the store")
	}
	alive, _, err := st.Registered(ctx, time.Second)
	if err != nil || len(alive) != 1 {
		t.Fatalf("the registry: %v, %v; want node a alone", alive, err)
	}
	if _, err := redistest.Do(rs.Addr(), "ZREM", "ft:nodes", alive[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "node a to find itself taken for dead", func() bool { return strings.Contains(logs.String(), "taken for dead") })
	time.Sleep(100 * time.Millisecond) // the fence's closes are under way
	close(held.release)

	d := <-resumed
	if d.err != nil {
		t.Fatalf("the resume whose take was on its way when the node was fenced: %v; want it answered, then closed", d.err)
	}
	if got := d.c.Connected(); !got.Resumed {
		t.Errorf("the resume: %+v, want resumed", got)
	}
	select {
	case <-d.c.Done():
		if websocket.CloseStatus(d.c.Err()) != websocket.StatusServiceRestart {
			t.Errorf("closed with %v, want 1012 (reconnect)", d.c.Err())
		}
	case <-time.After(5 * time.Second):
		t.Error("the fenced node's client was not asked to reconnect")
	}
	d.c.Close()
}

// TestALateTakeLeavesTheSessionToTheNewerConnect: a client's resume on
// node a waits for its take-over in the store (a node stalled in a
// storm); the client gives up on it and resumes on node b, which hands
// it a new secret; then a's take lands, presenting the secret the
// client presented to both. It must write nothing: it took the session
// over, the secret the client held was void, and the session ended
// after its grace with nobody attached, its keys with it (4 clients of
// a reconnect storm of 100,000).
func TestALateTakeLeavesTheSessionToTheNewerConnect(t *testing.T) {
	t.Parallel() // waits on wall-clock time (grace)
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	var logs syncBuffer
	const grace = 3 * time.Second
	cfg := server.Config{NodeID: "a", NodeTimeout: time.Second, LeaseGrace: grace, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	held := &heldTakes{Store: redisAt(t, rs, "late"), waiting: make(chan struct{}, 1), release: make(chan struct{})}
	a := servertest.Start(t, servertest.Options{Store: held, Server: cfg})
	cfg.NodeID, cfg.Logger = "b", nil
	b := servertest.Start(t, servertest.Options{Store: redisAt(t, rs, "late"), Server: cfg})

	c := dial(t, b, nil)
	if _, err := c.Put(ctx, room, "presence/u", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	first := c.Connected()
	_ = c.Close()

	held.held.Store(true)
	gaveUp, giveUp := context.WithCancel(ctx)
	dialed := make(chan error, 1)
	go func() {
		c, err := client.Dial(gaveUp, a.WS, &client.Options{Session: first.Session, Resume: first.Resume})
		if err == nil {
			_ = c.Close()
		}
		dialed <- err
	}()
	select {
	case <-held.waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the resume's take-over never reached the store")
	}
	// The client waits a while (the SDK: connectTimeoutMs), so the two
	// connects are read further apart than the nodes' clocks may differ.
	time.Sleep(time.Second)
	giveUp()
	if err := <-dialed; err == nil {
		t.Fatal("the resume given up on: connected")
	}
	c = dial(t, b, &client.Options{Session: first.Session, Resume: first.Resume})
	second := c.Connected()
	if !second.Resumed {
		t.Fatalf("the resume on b: %+v, want resumed", second)
	}
	held.held.Store(false)
	close(held.release)
	waitFor(t, 10*time.Second, "a's late take to land", func() bool { return held.landed.Load() == 1 })
	if !strings.Contains(logs.String(), "not taking it back") {
		t.Errorf("node a logged nothing of its late take: %s", logs.String())
	}
	time.Sleep(grace + time.Second) // past the grace: the session must not end
	if l, err := b.HTTP.List(ctx, room, ""); err != nil || len(l.Items) != 1 {
		t.Fatalf("the session's key: %+v, %v; want it kept", l, err)
	}
	_ = c.Close()
	c = dial(t, b, &client.Options{Session: second.Session, Resume: second.Resume})
	defer c.Close()
	if got := c.Connected(); !got.Resumed || got.Session != first.Session {
		t.Fatalf("resuming with the secret b handed out: %+v, want session %s resumed", got, first.Session)
	}
}

// redisAt opens a Redis store on rs under prefix.
func redisAt(t *testing.T, rs *redistest.Server, prefix string) *redisstore.Store {
	t.Helper()
	st, err := redisstore.New(servertest.Context(t), redisstore.Config{URL: rs.URL(), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return st
}
