package main

// Sessions across the nodes of one Redis (issue 12): a client resumes its
// session on whichever node it reaches, and a rolling restart (or a
// crash) of the nodes deletes no session-bound key of a client that came
// back; the keys of clients that did not are deleted once.

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
)

// TestSessionsAcrossNodes: 3 nodes on one redis-server, 30 clients spread
// over them, each with a session-bound key and a watcher of the room.
// "rolling": each node in turn is stopped (SIGTERM) and started again;
// its clients reconnect to the next node with their session and resume
// secret. "SIGKILL": one node crashes; its clients reconnect to the next.
// Every reconnect resumes its session, no watcher sees a delete of the
// key of a client that came back, and those keys are all there after
// the grace and the node timeout. The clients of the first node that do
// not come back (one in 6) have their keys deleted, each once.
func TestSessionsAcrossNodes(t *testing.T) {
	t.Parallel()
	statecastBin(t)
	if !serveHasFlag("node-timeout") {
		t.Skip("the build has no --node-timeout")
	}
	for _, how := range []string{"rolling", "SIGKILL", "rolling on Redis Cluster"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			sessAcrossNodes(t, how == "SIGKILL", how == "rolling on Redis Cluster")
		})
	}
}

func sessAcrossNodes(t *testing.T, crash, cluster bool) {
	const grace, room = 3 * time.Second, "lobby"
	n := 36
	if v, err := strconv.Atoi(os.Getenv("SESSION_NODES_CLIENTS")); err == nil && v >= 6 {
		n = v // a multiple of 6 keeps "one in 6 do not come back" even
	}
	c := startCluster(t, 3, mnOptions{Cluster: cluster, Args: []string{"--lease-grace", grace.String()}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	clients := make([]*sessClient, n)
	on := make([]int, n) // the node each client is connected to
	// Clients of node 0 with i%6 == 0 do not come back.
	gone := func(i int) bool { return i%6 == 0 }
	var reconnects, resumed atomic.Int64
	connect := func(i, node int, resume bool) error {
		sc := clients[i]
		var opts *client.Options
		if resume {
			opts = &client.Options{Session: sc.first.Session, Resume: sc.first.Resume}
		}
		conn, err := client.Dial(ctx, c.nodes[node].WS(), opts)
		if err != nil {
			return err
		}
		if resume {
			reconnects.Add(1)
			if conn.Connected().Resumed && conn.Connected().Session == sc.first.Session {
				resumed.Add(1)
			}
		}
		sc.conn, sc.first, on[i] = conn, conn.Connected(), node
		return sc.follow(ctx, conn, room)
	}
	err := inParallel(n, func(i int) error {
		clients[i] = &sessClient{key: fmt.Sprint("k/", i), view: client.NewView(), deletes: map[string]int{}}
		if err := connect(i, i%3, false); err != nil {
			return err
		}
		_, err := clients[i].conn.Put(ctx, room, clients[i].key, i, client.WithLease("session"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "every watcher to hold every key", func() bool {
		for _, sc := range clients {
			if k, _, _ := sc.state(); k != n {
				return false
			}
		}
		return true
	})

	// down takes node i down and moves its clients to the next node.
	down := func(i int, kill bool) {
		if kill {
			c.nodes[i].kill()
		} else {
			c.nodes[i].stop()
		}
		var moving []int
		for j := range clients {
			if on[j] == i && clients[j].conn != nil {
				<-clients[j].conn.Done()
				<-clients[j].watching
				if gone(j) {
					clients[j].conn = nil
				} else {
					moving = append(moving, j)
				}
			}
		}
		var before map[string]int
		if !cluster {
			before = c.commandCalls()
		}
		start := time.Now()
		if err := inParallel(len(moving), func(k int) error { return connect(moving[k], (i+1)%3, true) }); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		if !cluster && len(moving) > 0 {
			after, calls := c.commandCalls(), 0
			for cmd, k := range after {
				calls += k - before[cmd]
			}
			t.Logf("node %d down: %d clients resumed on node %d in %v (connect + subscribe from their position), %.1f Redis commands each (scripts count their inner commands)",
				i, len(moving), (i+1)%3, took.Round(time.Millisecond), float64(calls)/float64(len(moving)))
		}
	}
	firstDown := time.Now() // the grace of the clients that do not come back starts after this
	if crash {
		down(0, true)
		c.nodes[0].start(t)
	} else {
		for i := range c.nodes {
			down(i, false)
			c.nodes[i].start(t)
		}
	}

	var back []*sessClient
	goneKeys := map[string]int{}
	for i, sc := range clients {
		if sc.conn == nil {
			goneKeys[sc.key] = 1
		} else {
			back = append(back, clients[i])
		}
	}
	waitUntil(t, 60*time.Second, "every watcher to see the deletes of the keys of the clients that did not come back", func() bool {
		for _, sc := range back {
			if _, d, _ := sc.state(); len(d) < len(goneKeys) {
				return false
			}
		}
		return true
	})
	if since := time.Since(firstDown); since < grace {
		t.Errorf("the keys of the clients that did not come back were deleted %v after their node went down, before the grace %v", since, grace)
	}
	// Past the grace and the node timeout: a session not resumed, or
	// ended by a dead node's claim, would have lost its key by now.
	time.Sleep(grace + c.nodeTO + 2*time.Second)

	if r, a := resumed.Load(), reconnects.Load(); r != a {
		t.Errorf("%d of %d reconnects to another node resumed their session", r, a)
	}
	for _, sc := range back {
		_, d, err := sc.state()
		if err != nil {
			t.Fatalf("watcher of %s: %v", sc.key, err)
		}
		if !maps.Equal(d, goneKeys) {
			t.Fatalf("watcher of %s saw %v deletes (%d of the keys of the %d clients that came back), want one delete of each of the %d keys of the clients that did not",
				sc.key, d, countDeletes(d, back), len(back), len(goneKeys))
		}
	}
	var keys, want []string
	for _, it := range c.snapshot(room).Items {
		keys = append(keys, it.Key)
	}
	for _, sc := range back {
		want = append(want, sc.key)
	}
	slices.Sort(keys)
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("keys after the grace: %v, want those of the %d clients that came back", keys, len(want))
	}
	for _, sc := range back {
		sc.conn.CloseNow()
	}
}
