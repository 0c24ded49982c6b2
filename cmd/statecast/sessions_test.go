package main

// Sessions across a restart of a `statecast serve` process on the file
// store (issue 12): clients that come back within the grace resume their
// sessions and keep their session-bound keys; the others' keys are
// deleted once, after the grace.

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/wire"
)

// sessClient is one client: a session-bound key k/<i> and a watcher of
// the room (its own subscription, resumed from its view across the
// restart) counting the delete events it sees.
type sessClient struct {
	key   string
	conn  *client.Conn
	first wire.Message // connected, from the first process

	mu       sync.Mutex
	view     *client.View
	deletes  map[string]int
	err      error
	watching chan struct{} // closed when the watcher has stopped
}

// follow subscribes conn to room from where the client's view is (a
// snapshot the first time, a resume after) and applies what arrives until
// the connection ends.
func (sc *sessClient) follow(ctx context.Context, conn *client.Conn, room string) error {
	sc.mu.Lock()
	from := sc.view.Position()
	sc.mu.Unlock()
	sub, err := conn.Subscribe(ctx, room, client.SubscribeOptions{From: from})
	if err != nil {
		return err
	}
	sc.watching = make(chan struct{})
	go func() {
		defer close(sc.watching)
		for {
			m, err := sub.Next(ctx)
			if err != nil {
				return // the connection ended
			}
			sc.mu.Lock()
			if err := sc.view.Apply(m); err != nil && sc.err == nil {
				sc.err = err
			}
			for _, ev := range m.Events {
				if ev.Type == "delete" {
					sc.deletes[ev.Key]++
				}
			}
			sc.mu.Unlock()
		}
	}()
	return nil
}

// state returns how many keys the view holds, its deletes and its error.
func (sc *sessClient) state() (int, map[string]int, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return len(sc.view.Items), maps.Clone(sc.deletes), sc.err
}

// inParallel runs fn(0..n-1) at once and returns the first error.
func inParallel(n int, fn func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = fn(i) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// sessionClients is how many clients come back: SESSION_CLIENTS, else 100.
func sessionClients(t *testing.T) int {
	if v := os.Getenv("SESSION_CLIENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SESSION_CLIENTS=%q", v)
		}
		return n
	}
	return 100
}

// TestSessionsSurviveRestart: one node on the file store, clients each
// with a session-bound key and a watcher. The node restarts (SIGTERM, and
// separately SIGKILL); most clients reconnect at once with their session
// and resume secret: every one of them is resumed, their watchers see no
// delete of their keys, and the keys are all there after the grace. The
// keys of the clients that do not come back are deleted after the grace,
// once (each watcher sees one delete of each).
func TestSessionsSurviveRestart(t *testing.T) {
	t.Parallel()
	statecastBin(t)
	back := sessionClients(t)
	for _, how := range []string{"SIGTERM", "SIGKILL"} {
		t.Run(how, func(t *testing.T) { sessRestart(t, how == "SIGKILL", back, 5) })
	}
}

func sessRestart(t *testing.T, crash bool, back, gone int) {
	const grace, room = 3 * time.Second, "lobby"
	node := &mnNode{name: "file", redisURL: "file", extra: []string{"--data", t.TempDir(), "--lease-grace", grace.String()}}
	node.start(t)
	t.Cleanup(node.kill)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	clients := make([]*sessClient, back+gone)
	err := inParallel(len(clients), func(i int) error {
		sc := &sessClient{key: fmt.Sprint("k/", i), view: client.NewView(), deletes: map[string]int{}}
		clients[i] = sc
		c, err := client.Dial(ctx, node.WS(), nil)
		if err != nil {
			return err
		}
		sc.conn, sc.first = c, c.Connected()
		if _, err := c.Put(ctx, room, sc.key, i, client.WithLease("session")); err != nil {
			return err
		}
		return sc.follow(ctx, c, room)
	})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "every watcher to hold every key", func() bool {
		for _, sc := range clients {
			if n, _, _ := sc.state(); n != len(clients) {
				return false
			}
		}
		return true
	})

	if crash {
		node.kill()
	} else {
		node.stop()
	}
	for _, sc := range clients {
		<-sc.conn.Done()
		<-sc.watching
	}
	starting := time.Now() // the node's grace starts after this
	node.start(t)
	restarted := time.Now() // and before this
	var resumed atomic.Int64
	err = inParallel(back, func(i int) error {
		sc := clients[i]
		c, err := client.Dial(ctx, node.WS(), &client.Options{Session: sc.first.Session, Resume: sc.first.Resume})
		if err != nil {
			return err
		}
		sc.conn = c
		if c.Connected().Resumed && c.Connected().Session == sc.first.Session {
			resumed.Add(1)
		}
		return sc.follow(ctx, c, room)
	})
	took := time.Since(restarted)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d clients reconnected after the restart in %v; %d resumed", back, took, resumed.Load())

	goneKeys := map[string]int{}
	for _, sc := range clients[back:] {
		goneKeys[sc.key] = 1
	}
	waitUntil(t, 30*time.Second, "every watcher to see the deletes of the keys of the clients that did not come back", func() bool {
		for _, sc := range clients[:back] {
			if _, d, _ := sc.state(); len(d) < gone {
				return false
			}
		}
		return true
	})
	if since := time.Since(starting); since < grace {
		t.Errorf("the keys of the clients that did not come back were deleted %v after the restart, before the grace %v", since, grace)
	}
	// Past the grace for everyone: a session not resumed would have lost
	// its key by now.
	time.Sleep(time.Until(restarted.Add(grace + time.Second)))

	if n := resumed.Load(); n != int64(back) {
		t.Errorf("%d of %d sessions resumed after the restart", n, back)
	}
	for _, sc := range clients[:back] {
		_, d, err := sc.state()
		if err != nil {
			t.Fatalf("watcher of %s: %v", sc.key, err)
		}
		if !maps.Equal(d, goneKeys) {
			t.Fatalf("watcher of %s saw %d deleted keys (%d deletes of the %d keys of the clients that came back), want one delete of each of the %d keys of the clients that did not",
				sc.key, len(d), countDeletes(d, clients[:back]), back, gone)
		}
	}
	l, err := (&client.HTTP{URL: node.HTTP()}).List(ctx, room, "")
	if err != nil {
		t.Fatal(err)
	}
	var keys, want []string
	for _, it := range l.Items {
		keys = append(keys, it.Key)
	}
	for _, sc := range clients[:back] {
		want = append(want, sc.key)
	}
	slices.Sort(keys)
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("%d keys after the grace, want the %d of the clients that came back", len(keys), len(want))
	}
	for _, sc := range clients[:back] {
		sc.conn.CloseNow()
	}
}

// waitUntil polls cond until it holds, failing the test after timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}

// countDeletes counts the deletes in d of the keys of clients.
func countDeletes(d map[string]int, clients []*sessClient) int {
	n := 0
	for _, sc := range clients {
		n += d[sc.key]
	}
	return n
}
