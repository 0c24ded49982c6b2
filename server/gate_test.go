package server

// The connect gate's queue (admit.go): places handed over first come first
// served, never more than the limit inside, no place lost to a waiter that
// gave up.

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// until polls cond for up to 5 s.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestGateQueueOrder: waiters get the places given back in the order they
// came, and a newcomer queues behind them rather than taking a place.
func TestGateQueueOrder(t *testing.T) {
	g := &connectGate{limit: 1, wait: time.Minute}
	if !g.enter(context.Background()) {
		t.Fatal("the first connect was refused a free place")
	}
	got := make(chan int, 3)
	for i := range 3 {
		go func() {
			if g.enter(context.Background()) {
				got <- i
			} else {
				got <- -1
			}
		}()
		until(t, "the waiter to queue", func() bool { return g.queued() == i+1 })
	}
	for want := range 3 {
		g.leave()
		if g.tryEnter() {
			t.Fatal("a newcomer took the place given back while connects queued")
		}
		if i := <-got; i != want {
			t.Fatalf("place %d went to waiter %d, want %d", want, i, want)
		}
	}
	g.leave()
	if n := g.n.Load(); n != 0 {
		t.Errorf("places taken after all left: %d, want 0", n)
	}
}

// TestGateQueueBound: past queuePerPlace waiters a place, a connect is
// refused at once, however long the wait.
func TestGateQueueBound(t *testing.T) {
	g := &connectGate{limit: 2, wait: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	var waiters sync.WaitGroup
	defer func() { cancel(); waiters.Wait() }()
	g.enter(ctx)
	g.enter(ctx)
	for range queuePerPlace * 2 {
		waiters.Go(func() { g.enter(ctx) })
	}
	until(t, "the queue to fill", func() bool { return g.queued() == queuePerPlace*2 })
	refused := make(chan bool)
	go func() { refused <- !g.enter(context.Background()) }()
	select {
	case ok := <-refused:
		if !ok {
			t.Fatal("a connect past a full queue was admitted")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a connect past a full queue waited instead of being refused at once")
	}
}

// TestGateWaitEnds: a waiter whose wait or request ends is refused and
// leaves the queue; the place given back next is free, not handed to it.
func TestGateWaitEnds(t *testing.T) {
	g := &connectGate{limit: 1, wait: 20 * time.Millisecond}
	g.enter(context.Background())
	if g.enter(context.Background()) {
		t.Fatal("a waiter was admitted with the one place taken")
	}
	g.wait = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool)
	go func() { done <- g.enter(ctx) }()
	until(t, "the waiter to queue", func() bool { return g.queued() == 1 })
	cancel()
	if <-done {
		t.Fatal("a waiter whose request ended was admitted")
	}
	if q := g.queued(); q != 0 {
		t.Errorf("queued after both gave up: %d, want 0", q)
	}
	g.leave()
	if n := g.n.Load(); n != 0 {
		t.Errorf("places taken after the holder left: %d, want 0 (a place went to a waiter that gave up)", n)
	}
}

// TestGateClose: closing refuses every waiter and every later connect past
// the limit.
func TestGateClose(t *testing.T) {
	g := &connectGate{limit: 1, wait: time.Hour}
	g.enter(context.Background())
	done := make(chan bool)
	go func() { done <- g.enter(context.Background()) }()
	until(t, "the waiter to queue", func() bool { return g.queued() == 1 })
	g.close()
	if <-done {
		t.Error("a waiter was admitted by close")
	}
	if g.enter(context.Background()) {
		t.Error("a connect past the limit was admitted after close")
	}
	if n := g.n.Load(); n != 1 {
		t.Errorf("places taken: %d, want 1 (the holder's)", n)
	}
}

// TestGateContended: many connects entering, waiting, giving up and
// leaving at random never put more than the limit inside, and every place
// comes back.
func TestGateContended(t *testing.T) {
	const limit = 4
	g := &connectGate{limit: limit, wait: 2 * time.Millisecond}
	var inside, most atomic.Int64
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 300 {
				ctx, cancel := context.WithCancel(context.Background())
				if r.IntN(8) == 0 {
					time.AfterFunc(time.Duration(r.IntN(2000))*time.Microsecond, cancel)
				}
				if g.enter(ctx) {
					in := inside.Add(1)
					for m := most.Load(); in > m && !most.CompareAndSwap(m, in); m = most.Load() {
					}
					time.Sleep(time.Duration(r.IntN(500)) * time.Microsecond)
					inside.Add(-1)
					g.leave()
				}
				cancel()
			}
		})
	}
	wg.Wait()
	if m := most.Load(); m > limit {
		t.Errorf("%d connects inside at once, limit %d", m, limit)
	}
	if n, q := g.n.Load(), g.queued(); n != 0 || q != 0 {
		t.Errorf("after all left: %d places taken, %d queued; want 0, 0", n, q)
	}
}
