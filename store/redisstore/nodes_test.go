package redisstore

import (
	"fmt"
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
