package redisstore

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/statecast/statecast/store/redistest"
)

// TestTakeTurn: of nodes asking for a free turn at once, one gets it;
// nobody else does until it expires, and then one does; turns of other
// names are apart.
func TestTakeTurn(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	const ttl = 300 * time.Millisecond
	race := func(name string) int32 {
		var won atomic.Int32
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if ok, err := s.TakeTurn(bg, name, fmt.Sprint("n", i), ttl); err != nil {
					t.Errorf("TakeTurn: %v", err)
				} else if ok {
					won.Add(1)
				}
			}()
		}
		wg.Wait()
		return won.Load()
	}
	start := time.Now()
	if n := race("a"); n != 1 {
		t.Fatalf("%d of 8 nodes took a free turn, want 1", n)
	}
	if n := race("b"); n != 1 {
		t.Fatalf("%d of 8 nodes took a free turn of another name, want 1", n)
	}
	if n := race("a"); n != 0 && time.Since(start) < ttl {
		t.Fatalf("%d nodes took a turn held for %v, want 0", n, ttl)
	}
	time.Sleep(ttl)
	if n := race("a"); n != 1 {
		t.Fatalf("%d of 8 nodes took an expired turn, want 1", n)
	}
}

// TestBeatWithReadsQueued: with every connection of the read pool held
// (a burst's room loads and session reads, each slow), a node still beats
// and reads the registry within a beat's interval. Beats queued behind
// the reads missed the node timeout, and live nodes were taken for dead.
func TestBeatWithReadsQueued(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	held := 10*runtime.GOMAXPROCS(0) + 10 // go-redis's default pool, and more waiting
	var wg sync.WaitGroup
	for i := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.rc.BLPop(bg, 2*time.Second, fmt.Sprint("nothing-", i)).Err()
		}()
	}
	defer wg.Wait()
	for deadline := time.Now().Add(time.Second); s.rc.PoolStats().TotalConns < uint32(held-10); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the read pool: %+v, want %d held", s.rc.PoolStats(), held-10)
		}
	}
	ctx, cancel := context.WithTimeout(bg, 500*time.Millisecond)
	defer cancel()
	if _, err := s.Beat(ctx, "a"); err != nil {
		t.Fatalf("a beat with the read pool held: %v", err)
	}
	if alive, _, err := s.Registered(ctx, time.Minute); err != nil || len(alive) != 1 {
		t.Fatalf("the registry with the read pool held: %v, %v; want [a]", alive, err)
	}
}

// TestBeatReached: once a beat has mapped the node's clock onto Redis's,
// a beat says when Redis ran it: within its round trip.
func TestBeatReached(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	first, err := s.Beat(bg, "a")
	if err != nil || !first.Added || first.Reached != 0 {
		t.Fatalf("the first beat: %+v, %v; want added, not known when it reached Redis", first, err)
	}
	for range 20 {
		sent := time.Now()
		b, err := s.Beat(bg, "a")
		rtt := time.Since(sent)
		if err != nil || b.Added {
			t.Fatalf("a beat: %+v, %v", b, err)
		}
		// Whole milliseconds on both clocks: up to 2 ms of rounding.
		if b.Reached > rtt+2*time.Millisecond {
			t.Fatalf("a beat reached Redis %v after it was sent, answered in %v", b.Reached, rtt)
		}
	}
	// Redis busy with a long script, sent well before the beat: the beat
	// waits in Redis's queue, so most of its round trip is before Redis
	// runs it. (A beat read in the same turn of Redis's loop as the
	// script runs at once and waits for its answer instead.)
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	script := "local i = 0 while i < 30000000 do i = i + 1 end return 1"
	if _, err := fmt.Fprintf(c, "*3\r\n$4\r\nEVAL\r\n$%d\r\n%s\r\n$1\r\n0\r\n", len(script), script); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	sent := time.Now()
	b, err := s.Beat(bg, "a")
	rtt := time.Since(sent)
	if err != nil || rtt < 50*time.Millisecond || b.Reached < rtt/2 {
		t.Fatalf("a beat behind a busy Redis reached it after %v, answered in %v (%v): want the most of it before", b.Reached, rtt, err)
	}
}
