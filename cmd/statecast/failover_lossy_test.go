package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store/redistest"
)

// A failover that really loses writes, made to happen deterministically
// over real processes: a master, one replica and a Sentinel, 2 nodes on
// the redis+sentinel:// URL, 4 clients running the linearizability
// check's operations on room lz throughout (checked with lzEpochModel).
// Beside them, lossyFailover freezes the replica and cuts its link, so
// that nothing more reaches it, writes on the master, SIGKILLs the master
// and thaws the replica, which the Sentinel promotes with the offset it
// had. What the writes of that window became, and what clients see of
// the room, is checked on keys of its own (kept, lost, after).

// TestLossyFailover: without the replica acknowledgement the window's
// writes are acknowledged and then lost; with --redis-min-replicas 1 they
// are answered outcome unknown (504), none acknowledged, and nothing
// acknowledged is lost. Either way the nodes had delivered them, so the
// room starts a new epoch: every answer after the master's death is of
// it, and watchers resync from its snapshot (about 10 s each).
func TestLossyFailover(t *testing.T) {
	for _, minReplicas := range []int{0, 1} {
		t.Run("min-replicas="+strconv.Itoa(minReplicas), func(t *testing.T) {
			redistest.Require(t)
			statecastBin(t)
			f := redistest.StartFailover(t, 1, 1, time.Second, redistest.Options{})
			urls := startNodesOn(t, 2, f.URL(), "--redis-min-replicas", strconv.Itoa(minReplicas), "--redis-replica-timeout", "300ms")
			lzCheck(t, urls, "", 4, 0, func(ctx context.Context) { lossyFailover(ctx, t, f, urls, minReplicas > 0, "") }, lzEpochModel(minReplicas > 0))
		})
	}
}

// lossyFailover is TestLossyFailover's fault, with its checks; ack says
// that writes wait for the replica. It runs beside the test's goroutine:
// Errorf, never Fatal.
func lossyFailover(ctx context.Context, t *testing.T, f *redistest.Failover, urls []string, ack bool, p string) {
	if !lzPause(ctx, 300, 500) {
		return
	}
	// A Sentinel that took part in the last failover starts no other for
	// twice its failover timeout.
	if wait := time.Until(f.Promoted.Add(2*f.Timeout + 500*time.Millisecond)); wait > 0 && !lzPause(ctx, int(wait.Milliseconds()), int(wait.Milliseconds())+1) {
		return
	}
	master, err := f.Master()
	if err != nil {
		t.Errorf("asking the Sentinel for the master: %v", err)
		return
	}
	replica := f.Data[0]
	if replica == master {
		replica = f.Data[1]
	}
	keptRev, old, err := epochPut(ctx, urls[0], p+"kept", "before")
	if err != nil {
		t.Errorf("writing kept before the failover: %v", err)
		return
	}
	watch, err := watchLossy(ctx, urls[0], p, nil)
	if err != nil {
		t.Errorf("watching before the failover: %v", err)
		return
	}
	defer watch.conn.CloseNow()
	if err := f.WaitReplicated(master, 10*time.Second); err != nil {
		t.Errorf("the replica does not hold kept: %v", err)
		return
	}

	// Frozen, the replica reconnects to nothing; with its link cut,
	// nothing more written reaches it (a frozen replica whose link stayed
	// up would still find what the master sent in its socket's buffer).
	if err := replica.Signal(syscall.SIGSTOP); err != nil {
		t.Error(err)
		return
	}
	if _, err := redistest.Do(master.Addr(), "CLIENT", "KILL", "TYPE", "replica"); err != nil {
		t.Errorf("cutting the replica's link: %v", err)
		return
	}
	for i := range 4 {
		value := fmt.Sprint("lost-", i)
		rev, epoch, err := epochPut(ctx, urls[i%2], p+"lost", value)
		var ce *client.Error
		switch {
		case !ack && (err != nil || epoch != old || rev <= keptRev):
			t.Errorf("%s with the replica cut off, no acknowledgement: rev %d, epoch %q, %v; want acknowledged in epoch %q after %d", value, rev, epoch, err, old, keptRev)
		case ack && (!errors.As(err, &ce) || ce.Status != http.StatusGatewayTimeout || !errors.Is(err, client.ErrOutcomeUnknown)):
			t.Errorf("%s with the replica cut off, --redis-min-replicas 1: rev %d, %v; want 504 outcome_unknown", value, rev, err)
		}
	}
	// The master committed them and the nodes delivered them.
	lostAt, err := watch.until(ctx, func(v *client.View) bool { return string(v.Items[p+"lost"].Value) == `"lost-3"` })
	if err != nil {
		t.Errorf("the watcher did not see the writes the replica lacks: %v", err)
		return
	}

	master.Kill()
	killed := time.Now()
	if err := replica.Signal(syscall.SIGCONT); err != nil {
		t.Error(err)
		return
	}
	probes := probeNewEpoch(ctx, t, urls, old, p)
	m, err := f.WaitPromoted(master, 30*time.Second)
	if err != nil {
		probes.stop()
		t.Errorf("the replica was not promoted: %v", err)
		return
	}
	t.Logf("master killed, replica promoted after %v", time.Since(killed).Round(10*time.Millisecond))

	// Every node: the new epoch holds what the replica had.
	var epoch string
	for _, u := range urls {
		kept, e, err := waitGet(ctx, u, p+"kept", 15*time.Second)
		if err != nil || e == old || string(kept.Value) != `"before"` || kept.ModRev != keptRev {
			t.Errorf("%s: kept after the failover: %+v in epoch %q, %v; want \"before\" at %d in a new epoch (not %q)", u, kept, e, err, keptRev, old)
		}
		if epoch == "" {
			epoch = e
		} else if e != epoch {
			t.Errorf("%s: epoch %q after the failover, another node's is %q", u, e, epoch)
		}
		lost, e, err := epochGet(ctx, u, p+"lost")
		if !errors.Is(err, client.ErrNotFound) || e != epoch {
			t.Errorf("%s: lost after the failover: %+v in epoch %q, %v; want none in epoch %q (the replica never had it)", u, lost, e, err, epoch)
		}
	}
	// A replica again, so that writes are acknowledged with the
	// acknowledgement on, too.
	if err := f.Rejoin(master, m); err != nil {
		probes.stop()
		t.Errorf("rejoining the old master as a replica: %v", err)
		return
	}
	var afterRev uint64
	for i, u := range urls {
		// The node's first write may meet a connection the failover
		// broke (outcome unknown): it is sent again, as a client would.
		rev, e, err := epochPut(ctx, u, p+"after", fmt.Sprint("after-", i))
		for try := 0; try < 3 && (errors.Is(err, client.ErrOutcomeUnknown) || errors.Is(err, client.ErrUnavailable)); try++ {
			t.Logf("%s: a write after the failover: %v; sent again", u, err)
			pause(ctx, 200*time.Millisecond)
			rev, e, err = epochPut(ctx, u, p+"after", fmt.Sprint("after-", i))
		}
		if err != nil || e != epoch || rev <= keptRev || rev <= afterRev {
			t.Errorf("%s: a write after the failover: rev %d, epoch %q, %v; want a revision after %d in epoch %q", u, rev, e, err, max(keptRev, afterRev), epoch)
		}
		afterRev = max(afterRev, rev)
	}
	if n := probes.stopAnswered(10 * time.Second); n == 0 {
		t.Errorf("no read answered in the 10 s after the nodes wrote in the new epoch")
	} else {
		t.Logf("%d reads answered after the master died, all in the new epoch; the old epoch delivered up to %d, the new one's writes reached %d", n, lostAt, afterRev)
	}

	// The watcher from before: its subscription ends (room reset), never
	// continued into the new epoch; resumed on either node, it gets the
	// new epoch's snapshot, never a replay.
	_, err = watch.until(ctx, func(v *client.View) bool { return v.Items[p+"after"].Value != nil })
	if !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("the subscription from before the failover ended with %v (view %+v), want unavailable (room reset) before anything of the new epoch", err, watch.view.Items)
	}
	for _, u := range urls {
		resumed, err := watchLossy(ctx, u, p, watch.view.Position())
		if err != nil {
			t.Errorf("%s: resuming from %+v: %v", u, watch.view.Position(), err)
			continue
		}
		first := resumed.first
		if first.T != wire.TSnapshot || first.Reason != "epoch" || first.Epoch != epoch {
			t.Errorf("%s: resumed from %+v, the first message is %s (reason %q, epoch %q); want a snapshot (reason epoch) of epoch %q", u, watch.view.Position(), first.T, first.Reason, first.Epoch, epoch)
			resumed.conn.CloseNow()
			continue
		}
		// The snapshot is of the node's view, which may not have the last
		// write of another node yet: events bring it.
		if _, err := resumed.until(ctx, func(v *client.View) bool { return v.Items[p+"after"].ModRev >= afterRev }); err != nil {
			t.Errorf("%s: resumed in the new epoch: %v", u, err)
		}
		resumed.conn.CloseNow()
		v := resumed.view
		if v.Items[p+"lost"].Value != nil || string(v.Items[p+"kept"].Value) != `"before"` || v.Items[p+"after"].ModRev != afterRev {
			t.Errorf("%s: the new epoch's snapshot holds %+v; want kept, no lost, after at %d", u, v.Items, afterRev)
		}
	}
}

// lossyWatch is a WebSocket subscription to lossyFailover's keys of room
// lz, with its view.
type lossyWatch struct {
	conn  *client.Conn
	sub   *client.Subscription
	view  *client.View
	first wire.Message
}

// watchLossy subscribes on the node at url, from a position or from a
// snapshot, and reads the first message.
func watchLossy(ctx context.Context, url, p string, from *wire.Position) (*lossyWatch, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := client.Dial(dctx, wsURL(url), nil)
	if err != nil {
		return nil, err
	}
	w := &lossyWatch{conn: conn, view: client.NewView()}
	if w.sub, err = conn.Subscribe(dctx, "lz", client.SubscribeOptions{Prefixes: []string{p + "kept", p + "lost", p + "after"}, From: from}); err == nil {
		if w.first, err = w.sub.Next(dctx); err == nil {
			err = w.view.Apply(w.first)
		}
	}
	if err != nil {
		conn.CloseNow()
		return nil, err
	}
	return w, nil
}

// until applies the subscription's messages until done holds (within
// 10 s) and returns the view's revision; an error when the subscription
// ends first.
func (w *lossyWatch) until(ctx context.Context, done func(*client.View) bool) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for !done(w.view) {
		m, err := w.sub.Next(ctx)
		if err != nil {
			return w.view.Rev, err
		}
		if err := w.view.Apply(m); err != nil {
			return w.view.Rev, err
		}
	}
	return w.view.Rev, nil
}

// newEpochProbes reads kept and lost on every node, over and over, from
// the old master's death until stop: an answer (a value or a 404) must
// never be of the old epoch, nor hold a write the replica lacked.
type newEpochProbes struct {
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	n, bad   int
	answered chan struct{} // closed at the first answer
}

func probeNewEpoch(ctx context.Context, t *testing.T, urls []string, old, prefix string) *newEpochProbes {
	ctx, cancel := context.WithCancel(ctx)
	p := &newEpochProbes{cancel: cancel, answered: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			u, key := urls[i%len(urls)], prefix+[]string{"kept", "lost"}[i/len(urls)%2]
			it, epoch, err := epochGet(ctx, u, key)
			if err == nil || errors.Is(err, client.ErrNotFound) {
				if p.n++; p.n == 1 {
					close(p.answered)
				}
				if (epoch == old || epoch == "" || key == prefix+"lost" && err == nil) && p.bad < 3 {
					p.bad++
					t.Errorf("%s: %s answered after the master died: %+v (%v) in epoch %q; want nothing of epoch %q nor of its lost tail", u, key, it, err, epoch, old)
				}
			}
			pause(ctx, 20*time.Millisecond)
		}
	}()
	return p
}

// stopAnswered waits up to timeout for a probe to be answered (the test's
// own reads may all fall in the moment the room is back before a probe
// asks again), then stops the probes and returns how many were answered.
func (p *newEpochProbes) stopAnswered(timeout time.Duration) int {
	select {
	case <-p.answered:
	case <-time.After(timeout):
	}
	return p.stop()
}

// stop ends the probes and returns how many were answered.
func (p *newEpochProbes) stop() int {
	p.cancel()
	p.wg.Wait()
	return p.n
}

// epochHTTP is a client of the node at url that keeps the epoch of each
// reply (for one caller at a time).
func epochHTTP(url string) (*client.HTTP, *epochRecorder) {
	rec := &epochRecorder{}
	return &client.HTTP{URL: url, Client: &http.Client{Transport: rec}}, rec
}

// epochGet reads key of room lz, with the reply's epoch.
func epochGet(ctx context.Context, url, key string) (wire.Item, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h, rec := epochHTTP(url)
	it, _, err := h.Get(ctx, "lz", key)
	return it, rec.epoch, err
}

// epochPut writes value (a JSON string) to key of room lz and returns the
// revision and the reply's epoch.
func epochPut(ctx context.Context, url, key, value string) (uint64, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h, rec := epochHTTP(url)
	v, _ := json.Marshal(value)
	rev, err := h.Put(ctx, "lz", key, v, nil, "")
	return rev, rec.epoch, err
}

// waitGet reads key until a node that may be between masters answers.
func waitGet(ctx context.Context, url, key string, timeout time.Duration) (wire.Item, string, error) {
	deadline := time.Now().Add(timeout)
	for {
		it, epoch, err := epochGet(ctx, url, key)
		if err == nil || errors.Is(err, client.ErrNotFound) || time.Now().After(deadline) || ctx.Err() != nil {
			return it, epoch, err
		}
		pause(ctx, 50*time.Millisecond)
	}
}
