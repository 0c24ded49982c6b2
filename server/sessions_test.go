package server_test

// Sessions on a store that keeps them (store.Sessions): they survive a
// restart of the node on the same file, with their session-bound keys.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// fileAuthEnv starts a node with auth on the file store at path.
func fileAuthEnv(t *testing.T, path string, grace time.Duration) *servertest.Node {
	t.Helper()
	authn, err := auth.New(auth.Config{HMACSecret: hmacSecret, Leeway: -1})
	if err != nil {
		t.Fatal(err)
	}
	return servertest.Start(t, servertest.Options{File: path, Server: server.Config{Auth: authn, LeaseGrace: grace}})
}

// dialAs connects as subject sub, resuming session/resume when set.
func dialAs(t *testing.T, e *servertest.Node, sub, session, resume string) *client.Conn {
	t.Helper()
	return dial(t, e, &client.Options{Token: tokenFor(t, sub, time.Now().Add(time.Hour), allRooms), Session: session, Resume: resume})
}

// storedKeys lists the keys of room, read from the store itself.
func storedKeys(t *testing.T, e *servertest.Node, room string) []string {
	t.Helper()
	snap, err := e.Store.Snapshot(context.Background(), room, "")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range snap.Items {
		keys = append(keys, kv.Key)
	}
	return keys
}

// sessionRecord returns the store's record of session id.
func sessionRecord(t *testing.T, e *servertest.Node, id string) (store.SessionRecord, bool) {
	t.Helper()
	rec, ok, err := e.Store.(store.Sessions).Session(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return rec, ok
}

// TestWSSessionSurvivesRestart: on the file store, a client that comes
// back within the grace after its node restarted resumes its session
// (resumed, a new resume secret) and keeps its session-bound keys, which
// are its lease again: it writes more under "session", and they end with
// the session once it is gone for the grace. A session without keys
// resumes too. Shutdown deleted nothing.
func TestWSSessionSurvivesRestart(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	path := filepath.Join(t.TempDir(), "statecast.db")
	ctx, room := servertest.Context(t), "lobby"
	e1 := fileAuthEnv(t, path, 10*time.Second)
	alice := dialAs(t, e1, "alice", "", "")
	if _, err := alice.Put(ctx, room, "presence/alice", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	bob := dialAs(t, e1, "bob", "", "") // no keys
	a1, b1 := alice.Connected(), bob.Connected()
	e1.Stop()

	const grace = 500 * time.Millisecond
	e2 := fileAuthEnv(t, path, grace)
	if got := storedKeys(t, e2, room); !slices.Equal(got, []string{"presence/alice"}) {
		t.Fatalf("keys after the restart: %v", got)
	}
	alice = dialAs(t, e2, "alice", a1.Session, a1.Resume)
	a2 := alice.Connected()
	if !a2.Resumed || a2.Session != a1.Session || a2.Resume == a1.Resume || a2.Resume == "" {
		t.Fatalf("alice after the restart: %+v, want session %s resumed with a new secret", a2, a1.Session)
	}
	if _, err := alice.Put(ctx, room, "presence/alice2", 1, client.WithLease("session")); err != nil {
		t.Fatalf("put under the resumed session's lease: %v", err)
	}
	bob = dialAs(t, e2, "bob", b1.Session, b1.Resume)
	if b2 := bob.Connected(); !b2.Resumed || b2.Session != b1.Session {
		t.Fatalf("bob after the restart: %+v, want session %s resumed", b2, b1.Session)
	}
	time.Sleep(3 * grace) // on purpose: well past the grace
	if got := storedKeys(t, e2, room); !slices.Equal(got, []string{"presence/alice", "presence/alice2"}) {
		t.Fatalf("keys after the grace: %v, want both of the resumed session's", got)
	}
	// The secret of before the restart is spent once the client has
	// presented the newest one.
	alice.CloseNow()
	alice = dialAs(t, e2, "alice", a1.Session, a2.Resume)
	if !alice.Connected().Resumed {
		t.Fatalf("alice with the newest secret: %+v", alice.Connected())
	}
	if c := dialAs(t, e2, "alice", a1.Session, a1.Resume); c.Connected().Resumed {
		t.Fatal("a spent resume secret took the session over")
	}
	// The session still ends, with its keys, once its client is gone.
	alice.CloseNow()
	waitFor(t, 10*time.Second, "the session's keys to be deleted", func() bool { return len(storedKeys(t, e2, room)) == 0 })
	waitFor(t, 10*time.Second, "the ended session's record to be deleted", func() bool {
		_, ok := sessionRecord(t, e2, a1.Session)
		return !ok
	})
}

// TestWSSessionRestartRefusesOthers: after a restart as before it, a
// session is resumed only with its current secret and by its subject;
// others get a new session and leave it as it was. A session whose client
// does not come back ends after the grace: keys and record deleted.
func TestWSSessionRestartRefusesOthers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "statecast.db")
	ctx, room := servertest.Context(t), "lobby"
	e1 := fileAuthEnv(t, path, 10*time.Second)
	alice := dialAs(t, e1, "alice", "", "")
	carol := dialAs(t, e1, "carol", "", "")
	for _, c := range []*client.Conn{alice, carol} {
		if _, err := c.Put(ctx, room, "presence/"+c.Connected().Session, 1, client.WithLease("session")); err != nil {
			t.Fatal(err)
		}
	}
	a1, c1 := alice.Connected(), carol.Connected()
	e1.Stop()

	const grace = 500 * time.Millisecond
	e2 := fileAuthEnv(t, path, grace)
	if m := dialAs(t, e2, "mallory", a1.Session, a1.Resume).Connected(); m.Resumed || m.Session == a1.Session {
		t.Fatalf("mallory with alice's secret: %+v, want a new session", m)
	}
	if m := dialAs(t, e2, "alice", a1.Session, "r_wrong").Connected(); m.Resumed || m.Session == a1.Session {
		t.Fatalf("alice with a wrong secret: %+v, want a new session", m)
	}
	if m := dialAs(t, e2, "alice", a1.Session, a1.Resume).Connected(); !m.Resumed || m.Session != a1.Session {
		t.Fatalf("alice with her secret after the others' attempts: %+v, want her session resumed", m)
	}
	// Carol never comes back.
	waitFor(t, 10*time.Second, "carol's key to be deleted", func() bool {
		return slices.Equal(storedKeys(t, e2, room), []string{"presence/" + a1.Session})
	})
	waitFor(t, 10*time.Second, "carol's record to be deleted", func() bool {
		_, ok := sessionRecord(t, e2, c1.Session)
		return !ok
	})
	if m := dialAs(t, e2, "carol", c1.Session, c1.Resume).Connected(); m.Resumed {
		t.Fatalf("carol after her session ended: %+v, want a new session", m)
	}
}

// TestWSSessionRecord: the store's record of a session follows it from
// its first session-bound key on: the hash of the current resume secret
// (never the secret), its subject; it is deleted when the session ends.
// A session that holds nothing has no record.
func TestWSSessionRecord(t *testing.T) {
	const grace = 200 * time.Millisecond
	e := servertest.Start(t, servertest.Options{File: filepath.Join(t.TempDir(), "statecast.db"), Server: server.Config{LeaseGrace: grace}})
	c := dialCodec(t, e, "json")
	first := c.Connected()
	if rec, ok := sessionRecord(t, e, first.Session); ok {
		t.Fatalf("a session holding nothing has a record: %+v", rec)
	}
	if _, err := c.Put(servertest.Context(t), "lobby", "presence/me", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	c.CloseNow()
	c = dial(t, e, &client.Options{Session: first.Session, Resume: first.Resume})
	m := c.Connected()
	rec, ok := sessionRecord(t, e, m.Session)
	hash := sha256.Sum256([]byte(m.Resume))
	if !ok || !m.Resumed || rec.ID != m.Session || rec.Subject != auth.Anonymous().Subject || !bytes.Equal(rec.ResumeHash, hash[:]) {
		t.Fatalf("record %+v (found %v) of %+v, want the hash of the current secret", rec, ok, m)
	}
	c.CloseNow()
	waitFor(t, 10*time.Second, "the ended session's record to be deleted", func() bool {
		_, ok := sessionRecord(t, e, m.Session)
		return !ok
	})
}

// TestSessionResumeFigures (SESSION_FIGURES=1): n clients, each with a
// session-bound key, resume at once after their node restarted on the
// file store: how long until all are resumed, and how many commits (one
// fsync each) their record writes cost.
func TestSessionResumeFigures(t *testing.T) {
	if os.Getenv("SESSION_FIGURES") != "1" {
		t.Skip("SESSION_FIGURES=1 to measure")
	}
	const n, room = 1000, "lobby"
	path := filepath.Join(t.TempDir(), "statecast.db")
	cfg := server.Config{LeaseGrace: time.Minute, WriteRate: 1e6}
	e1 := servertest.Start(t, servertest.Options{File: path, Server: cfg})
	ctx := servertest.Context(t)
	first := make([]wire.Message, n)
	conns := make([]*client.Conn, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c, err := client.Dial(ctx, e1.WS, nil)
			if err != nil {
				t.Error(err)
				return
			}
			conns[i], first[i] = c, c.Connected()
			if _, err := c.Put(ctx, room, fmt.Sprint("k/", i), i, client.WithLease("session")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	e1.Stop()
	for _, c := range conns {
		<-c.Done()
	}

	e2 := servertest.Start(t, servertest.Options{File: path, Server: cfg})
	f := e2.Store.(*store.File)
	before := f.Commits()
	var resumed atomic.Int64
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			c, err := client.Dial(ctx, e2.WS, &client.Options{Session: first[i].Session, Resume: first[i].Resume})
			if err != nil {
				t.Error(err)
				return
			}
			conns[i] = c
			if c.Connected().Resumed {
				resumed.Add(1)
			}
		})
	}
	wg.Wait()
	took, commits := time.Since(start), f.Commits()-before
	for _, c := range conns {
		c.CloseNow()
	}
	if resumed.Load() != n {
		t.Fatalf("%d of %d resumed", resumed.Load(), n)
	}
	t.Logf("%d clients resumed after a restart on the file store in %v; %d record writes in %d commits (fsyncs): %.3f fsyncs per resume",
		n, took, n, commits, float64(commits)/n)
}

// TestWSShutdownEndsNoSession: a graceful shutdown held up past the grace
// (a write in flight) ends no session: the session-bound key of a
// connection it closed is still in the store. The next start gives the
// session its grace.
func TestWSShutdownEndsNoSession(t *testing.T) {
	const grace = 100 * time.Millisecond
	bs := &blockingStore{Store: store.NewMemory(store.MemoryConfig{}), entered: make(chan struct{}, 1), release: make(chan struct{})}
	e := servertest.Start(t, servertest.Options{Store: bs, Server: server.Config{LeaseGrace: grace}})
	ctx, room := servertest.Context(t), "lobby"
	c := dialCodec(t, e, "json")
	if _, err := c.Put(ctx, room, "presence/me", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	blocked := dialCodec(t, e, "json")
	go func() { _, _ = blocked.Put(ctx, "block", "k", 1) }() // holds the shutdown up
	<-bs.entered
	stopped := make(chan struct{})
	go func() { e.Stop(); close(stopped) }()
	waitDone(t, c, 10*time.Second) // closed by the shutdown
	time.Sleep(5 * grace)          // on purpose: past the grace, the shutdown still going
	snap, err := bs.Store.Snapshot(ctx, room, "")
	close(bs.release)
	<-stopped
	if err != nil || len(snap.Items) != 1 {
		t.Fatalf("the session-bound key during a long shutdown: %+v, %v; want it kept", snap.Items, err)
	}
}

// blockingFile is a file store (with store.Sessions) whose writes to room
// "block" wait for release.
type blockingFile struct {
	*store.File
	entered chan struct{}
	release chan struct{}
}

func (b *blockingFile) Apply(ctx context.Context, room string, w store.Write) (store.Result, error) {
	if room == "block" {
		b.entered <- struct{}{}
		<-b.release
	}
	return b.File.Apply(ctx, room, w)
}

// TestWSSessionSlowShutdownEndsNothing: a session detached just before a
// shutdown that lasts longer than the grace keeps its record and its
// keys: after the restart its client resumes it with its key (the lease
// once ended on its own deadline in the lessor while the record stayed,
// so the client resumed an empty session).
func TestWSSessionSlowShutdownEndsNothing(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	const grace = 300 * time.Millisecond
	path := filepath.Join(t.TempDir(), "statecast.db")
	f, err := store.OpenFile(store.FileConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	bf := &blockingFile{File: f, entered: make(chan struct{}, 1), release: make(chan struct{})}
	e1 := servertest.Start(t, servertest.Options{Store: bf, Server: server.Config{LeaseGrace: grace}})
	ctx, room := servertest.Context(t), "lobby"
	alice := dialCodec(t, e1, "json")
	if _, err := alice.Put(ctx, room, "presence/alice", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	a1 := alice.Connected()
	blocked := dialCodec(t, e1, "json")
	go func() { _, _ = blocked.Put(ctx, "block", "k", 1) }()
	<-bf.entered
	alice.CloseNow() // detached: its grace runs
	time.Sleep(50 * time.Millisecond)
	stopped := make(chan struct{})
	go func() { e1.Stop(); close(stopped) }()
	time.Sleep(4 * grace)
	close(bf.release)
	<-stopped

	e2 := servertest.Start(t, servertest.Options{File: path, Server: server.Config{LeaseGrace: 10 * time.Second}})
	keys := storedKeys(t, e2, room)
	c := dial(t, e2, &client.Options{Session: a1.Session, Resume: a1.Resume})
	m := c.Connected()
	if !m.Resumed || m.Session != a1.Session || len(keys) != 1 {
		t.Fatalf("after a slow shutdown and a restart: keys %v, resumed %v: want the session resumed with its key", keys, m.Resumed)
	}
}

type failingSaves struct {
	*store.File
	fail atomic.Bool // set while the session code may retry a save
}

func (f *failingSaves) SaveSession(ctx context.Context, rec store.SessionRecord) error {
	if f.fail.Load() {
		return context.DeadlineExceeded
	}
	return f.File.SaveSession(ctx, rec)
}

// TestWSSessionUnsavedSecretNotHandedOut: when the store cannot save a
// resume's new secret (the session holds a key, so it has a record to
// keep in step), the connect fails (1011) instead of handing out a
// secret the store does not hold, and the secret the client presented
// still resumes the session, after a restart too.
func TestWSSessionUnsavedSecretNotHandedOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "statecast.db")
	f, err := store.OpenFile(store.FileConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	fs := &failingSaves{File: f}
	e1 := servertest.Start(t, servertest.Options{Store: fs, Server: server.Config{LeaseGrace: 10 * time.Second}})
	c := dialCodec(t, e1, "json")
	a1 := c.Connected()
	if _, err := c.Put(servertest.Context(t), "lobby", "presence/me", 1, client.WithLease("session")); err != nil {
		t.Fatal(err) // the session has a record from here on
	}
	c.CloseNow()
	fs.fail.Store(true)
	_, err = client.Dial(servertest.Context(t), e1.WS, &client.Options{Session: a1.Session, Resume: a1.Resume})
	if code := client.CloseCode(err); code != int(websocket.StatusInternalError) {
		t.Fatalf("connect whose secret cannot be saved: %v (close %d), want 1011", err, code)
	}
	e1.Stop()
	e2 := servertest.Start(t, servertest.Options{File: path, Server: server.Config{LeaseGrace: 10 * time.Second}})
	if m := dial(t, e2, &client.Options{Session: a1.Session, Resume: a1.Resume}).Connected(); !m.Resumed {
		t.Fatalf("the secret presented last, after a restart: %+v, want resumed", m)
	}
}

// blockingSaves is a file store whose session record writes wait for
// release while block is set.
type blockingSaves struct {
	*store.File
	block   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (b *blockingSaves) SaveSession(ctx context.Context, rec store.SessionRecord) error {
	if b.block.Load() {
		b.entered <- struct{}{}
		<-b.release
	}
	return b.File.SaveSession(ctx, rec)
}

// TestWSConnectWaitsForNoCommit: a connect whose session holds nothing
// waits for no store write (an fsync on the file store): with session
// record writes blocked, a client connects, subscribes and writes keys of
// no lease. Its first session-bound put waits for the session's record
// and commits after it; the next writes the record no more.
func TestWSConnectWaitsForNoCommit(t *testing.T) {
	f, err := store.OpenFile(store.FileConfig{Path: filepath.Join(t.TempDir(), "statecast.db")})
	if err != nil {
		t.Fatal(err)
	}
	bs := &blockingSaves{File: f, entered: make(chan struct{}, 1), release: make(chan struct{})}
	bs.block.Store(true)
	e := servertest.Start(t, servertest.Options{Store: bs})
	ctx, room := servertest.Context(t), "lobby"
	c := dialCodec(t, e, "json") // would wait for release if connect wrote the record
	if _, err := c.Subscribe(ctx, room, client.SubscribeOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, room, "plain", 1); err != nil {
		t.Fatal(err)
	}
	put := make(chan error, 1)
	go func() {
		_, err := c.Put(ctx, room, "presence/me", 1, client.WithLease("session"))
		put <- err
	}()
	select {
	case <-bs.entered:
	case err := <-put:
		t.Fatalf("a session-bound put without the session's record: %v, want it to wait for the record", err)
	}
	if keys := storedKeys(t, e, room); !slices.Equal(keys, []string{"plain"}) {
		t.Fatalf("keys while the record is being written: %v, want the session-bound one after it", keys)
	}
	bs.block.Store(false)
	close(bs.release)
	if err := <-put; err != nil {
		t.Fatal(err)
	}
	id := c.Connected().Session
	if rec, ok := sessionRecord(t, e, id); !ok || rec.Lease != "session:"+id {
		t.Fatalf("record after the session-bound put: %+v (found %v)", rec, ok)
	}
	bs.block.Store(true) // a write of the record now would hang the put
	if _, err := c.Put(ctx, room, "presence/me2", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
}

// TestWSSessionKeyNeedsRecord: a session-bound put whose session's record
// cannot be written fails unavailable and writes nothing; the session is
// still usable, and the next put writes the record and its key.
func TestWSSessionKeyNeedsRecord(t *testing.T) {
	f, err := store.OpenFile(store.FileConfig{Path: filepath.Join(t.TempDir(), "statecast.db")})
	if err != nil {
		t.Fatal(err)
	}
	fs := &failingSaves{File: f}
	fs.fail.Store(true)
	e := servertest.Start(t, servertest.Options{Store: fs})
	ctx, room := servertest.Context(t), "lobby"
	c := dialCodec(t, e, "json")
	_, err = c.Put(ctx, room, "presence/me", 1, client.WithLease("session"))
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("session-bound put without a record: %v, want unavailable", err)
	}
	if keys := storedKeys(t, e, room); len(keys) != 0 {
		t.Fatalf("keys after the failed put: %v, want none", keys)
	}
	fs.fail.Store(false)
	if _, err := c.Put(ctx, room, "presence/me", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	if _, ok := sessionRecord(t, e, c.Connected().Session); !ok {
		t.Fatal("no record after the session-bound put")
	}
}
