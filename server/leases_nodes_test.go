package server_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// TestLeasesAcrossNodes: on a store that several nodes share, the leased
// keys of a node that stops beating are deleted by exactly one survivor
// within the node timeout (plus a beat period and a scan), as ordinary
// delete events; a starting node never adopts the keys of a live one.
func TestLeasesAcrossNodes(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	ctx, room := testCtx(t), "lobby"
	open := func() store.Store {
		st, err := store.OpenRedis(ctx, store.RedisConfig{URL: rs.URL(), Prefix: "lt"})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	const timeout, grace = time.Second, 200 * time.Millisecond
	node := func(id string) *env {
		return newEnv(t, envOpts{Store: open(), Cfg: server.Config{NodeID: id, NodeTimeout: timeout, LeaseGrace: grace}})
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
	if err := ghost.(store.Nodes).Beat(ctx, "ghost", time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := next(); !slices.Equal(got, []string{"put:presence/ghost"}) {
		t.Fatalf("events %v, want the ghost's put", got)
	}
	start := time.Now()
	if got := next(); !slices.Equal(got, []string{"delete:presence/ghost"}) {
		t.Fatalf("events %v, want the ghost's key deleted", got)
	}
	if took, bound := time.Since(start), timeout+2*time.Second; took > bound {
		t.Errorf("the dead node's key was deleted after %v, want within %v", took, bound)
	}
	beats, err := ghost.(store.Nodes).Beats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := beats["ghost"]; ok || len(beats) != 3 {
		t.Errorf("registry after the claim: %v, want a, b and c only", beats)
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
}

// The lease names a node stores carry the node, so the survivors know
// whose keys they are; the name on the wire stays a flag.
func TestLeaseStoredUnderNode(t *testing.T) {
	e := newEnv(t, envOpts{Cfg: server.Config{NodeID: "n1"}})
	ctx := context.Background()
	c := dialCodec(t, e, "json")
	if _, err := c.Put(testCtx(t), "r", "k", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	var leases []string
	if err := e.St.Leased(ctx, func(_ string, kv store.KV) error { leases = append(leases, kv.Lease); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(leases) != 1 || !strings.HasPrefix(leases[0], "n1/") {
		t.Fatalf("stored leases %q, want one under node n1", leases)
	}
}
