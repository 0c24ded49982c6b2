package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/statecast/statecast/store/redistest"
)

// Redis failover under load, over real processes: a master, 2 replicas and
// 3 Sentinels (down after 1 s) on loopback, 3 statecast nodes on the
// redis+sentinel:// URL, 6 clients running the linearizability check's
// operations while the master is SIGKILLed and the Sentinels promote a
// replica. The history is checked with lzEpochModel: within an epoch no
// stale read and no revision reused; with --redis-min-replicas 1, also no
// acknowledged write lost, across epochs too.

// startFailoverNodes starts the Redis group and n nodes on it.
func startFailoverNodes(t *testing.T, n int, args ...string) (*redistest.Failover, []string) {
	t.Helper()
	redistest.Require(t)
	statecastBin(t)
	f := redistest.StartFailover(t, 2, 3, time.Second, redistest.Options{})
	return f, startNodesOn(t, n, f.URL(), args...)
}

// startNodesOn starts n nodes with --store storeURL and args, killed when
// the test ends; it returns their HTTP URLs.
func startNodesOn(t *testing.T, n int, storeURL string, args ...string) []string {
	t.Helper()
	var urls []string
	var nodes []*mnNode
	for i := range n {
		node := &mnNode{name: fmt.Sprintf("n%d", i), redisURL: storeURL, extra: append([]string{"--lease-grace", "1s"}, args...)}
		node.start(t)
		nodes = append(nodes, node)
		urls = append(urls, node.HTTP())
	}
	t.Cleanup(func() {
		for _, node := range nodes {
			node.kill()
		}
		if t.Failed() {
			for _, node := range nodes {
				t.Logf("node %s output (tail):\n%s", node.name, tail(node.output(), 3000))
			}
		}
	})
	return urls
}

// failoverFaults SIGKILLs the master times times, each after a pause
// under load; it waits for the Sentinels to promote a replica, and starts
// the killed server again as a replica of the new master, so the group
// has 2 replicas again for the next failover. It runs beside the test's goroutine: Errorf, never Fatal.
func failoverFaults(ctx context.Context, t *testing.T, f *redistest.Failover, times int) {
	pause := func(lo, hi int) bool { return lzPause(ctx, lo, hi) }
	for i := range times {
		if !pause(300, 800) {
			return
		}
		// Sentinels that took part in the last failover start no other
		// for twice their failover timeout.
		if wait := time.Until(f.Promoted.Add(2*f.Timeout + 500*time.Millisecond)); wait > 0 && !pause(int(wait.Milliseconds()), int(wait.Milliseconds())+1) {
			return
		}
		old, err := f.Master()
		if err != nil {
			t.Errorf("asking the Sentinels for the master: %v", err)
			return
		}
		start := time.Now()
		old.Kill()
		m, err := f.WaitPromoted(old, 30*time.Second)
		if err != nil {
			t.Errorf("no replica promoted after the master was killed: %v", err)
			return
		}
		t.Logf("failover %d: %s killed, %s promoted after %v", i+1, old.Addr(), m.Addr(), time.Since(start).Round(10*time.Millisecond))
		if err := f.Rejoin(old, m); err != nil {
			t.Errorf("rejoining %s: %v", old.Addr(), err)
			return
		}
	}
	pause(500, 1000) // operations on the new master, too
}

// TestFailoverLinearizable: one failover under load, with and without the
// replica acknowledgement (make test: about 20 s).
func TestFailoverLinearizable(t *testing.T) {
	for _, minReplicas := range []int{1, 0} {
		t.Run("min-replicas="+strconv.Itoa(minReplicas), func(t *testing.T) {
			f, urls := startFailoverNodes(t, 3, "--redis-min-replicas", strconv.Itoa(minReplicas))
			lzCheck(t, urls, "", 6, 0, func(ctx context.Context) { failoverFaults(ctx, t, f, 1) }, lzEpochModel(minReplicas > 0))
		})
	}
}

// TestClusterFailoverLinearizable: the same check on a Redis Cluster of 3
// masters with a replica each (cluster-node-timeout 1 s): the master of
// the room's slot is SIGKILLed under load and the cluster promotes its
// replica (about 20 s each).
func TestClusterFailoverLinearizable(t *testing.T) {
	for _, minReplicas := range []int{1, 0} {
		t.Run("min-replicas="+strconv.Itoa(minReplicas), func(t *testing.T) {
			redistest.Require(t)
			statecastBin(t)
			c := redistest.StartReplicatedCluster(t, 3, time.Second)
			urls := startNodesOn(t, 3, "redis://"+strings.Join(c.Addrs(), ","), "--redis-cluster", "--redis-min-replicas", strconv.Itoa(minReplicas))
			lzCheck(t, urls, "", 6, 0, func(ctx context.Context) {
				if !lzPause(ctx, 300, 800) {
					return
				}
				const key = "sc:{lz}:meta" // the room's slot
				old, err := c.MasterOf(key)
				if err != nil {
					t.Errorf("finding the room's master: %v", err)
					return
				}
				start := time.Now()
				old.Kill()
				var m *redistest.Server
				for m == nil || m == old {
					if m, err = c.MasterOf(key); time.Since(start) > 30*time.Second {
						t.Errorf("no replica of %s promoted within 30 s: %v", old.Addr(), err)
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
				t.Logf("%s killed, %s promoted after %v", old.Addr(), m.Addr(), time.Since(start).Round(10*time.Millisecond))
				lzPause(ctx, 500, 1000)
			}, lzEpochModel(minReplicas > 0))
		})
	}
}

// TestFailoverSoak runs failovers in rounds for -soak (make soak), each
// round on fresh keys, cycling through four groups: SIGKILLed masters
// (failoverFaults) and failovers that lose writes (lossyFailover, a
// master and one replica), each with and without the replica
// acknowledgement.
func TestFailoverSoak(t *testing.T) {
	d := soakDuration(t)
	type group struct {
		urls  []string
		ack   bool
		fault func(ctx context.Context, prefix string)
	}
	var groups []group
	for _, minReplicas := range []int{1, 0} {
		f, urls := startFailoverNodes(t, 3, "--redis-min-replicas", strconv.Itoa(minReplicas))
		groups = append(groups, group{urls, minReplicas > 0, func(ctx context.Context, _ string) { failoverFaults(ctx, t, f, 2) }})
	}
	for _, minReplicas := range []int{1, 0} {
		f := redistest.StartFailover(t, 1, 1, time.Second, redistest.Options{})
		urls := startNodesOn(t, 2, f.URL(), "--redis-min-replicas", strconv.Itoa(minReplicas), "--redis-replica-timeout", "300ms")
		ack := minReplicas > 0
		groups = append(groups, group{urls, ack, func(ctx context.Context, prefix string) { lossyFailover(ctx, t, f, urls, ack, prefix+"lossy/") }})
	}
	rounds := 0
	for end := time.Now().Add(d); time.Now().Before(end); rounds++ {
		g := groups[rounds%len(groups)]
		prefix := fmt.Sprintf("r%d/", rounds)
		lzCheck(t, g.urls, prefix, 6, 0, func(ctx context.Context) { g.fault(ctx, prefix) }, lzEpochModel(g.ack))
	}
	t.Logf("%d rounds linearizable", rounds)
}

// TestLzEpochModel: the model that checks failover histories refuses a
// stale read and a reused revision within an epoch, a return to an epoch
// left, and, when acknowledged writes must survive, a new epoch without
// one; it accepts a new epoch's state otherwise.
func TestLzEpochModel(t *testing.T) {
	put := func(c int, v string, rev uint64, epoch string, at int64) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: lzInput{op: "put", key: "a", value: v}, Output: lzOutput{modRev: rev, epoch: epoch}, Call: at, Return: at + 1}
	}
	get := func(c int, v string, rev uint64, epoch string, at int64) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: lzInput{op: "get", key: "a"}, Output: lzOutput{found: v != "", value: v, modRev: rev, epoch: epoch}, Call: at, Return: at + 1}
	}
	for _, c := range []struct {
		name      string
		keepAcked bool
		h         []porcupine.Operation
		want      porcupine.CheckResult
	}{
		{"continuity", true, []porcupine.Operation{put(0, "x", 5, "E1", 0), get(1, "x", 5, "E1", 2)}, porcupine.Ok},
		{"stale read", false, []porcupine.Operation{put(0, "x", 5, "E1", 0), put(0, "y", 6, "E1", 2), get(1, "x", 5, "E1", 4)}, porcupine.Illegal},
		{"revision reused", false, []porcupine.Operation{put(0, "x", 5, "E1", 0), get(1, "y", 5, "E1", 2)}, porcupine.Illegal},
		{"lost write, new epoch", false, []porcupine.Operation{put(0, "x", 5, "E1", 0), get(1, "w", 3, "E2", 2), put(0, "z", 4, "E2", 4)}, porcupine.Ok},
		{"lost acknowledged write", true, []porcupine.Operation{put(0, "x", 5, "E1", 0), get(1, "w", 3, "E2", 2)}, porcupine.Illegal},
		{"acknowledged write kept", true, []porcupine.Operation{put(0, "x", 5, "E1", 0), get(1, "x", 5, "E2", 2)}, porcupine.Ok},
		{"back to an epoch left", false, []porcupine.Operation{put(0, "x", 5, "E1", 0), get(1, "x", 5, "E2", 2), get(1, "x", 5, "E1", 4)}, porcupine.Illegal},
	} {
		m := lzEpochModel(c.keepAcked)
		if got := porcupine.CheckOperations(m.ToModel(), c.h); got != (c.want == porcupine.Ok) {
			t.Errorf("%s: linearizable %v, want %v", c.name, got, c.want)
		}
	}
}
