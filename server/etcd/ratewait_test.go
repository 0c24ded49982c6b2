package etcd_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/statecast/statecast/server/servertest"
)

// TestWritesWaitTheirTurn: etcd's clients do not retry ResourceExhausted,
// so a write over its writer's rate waits its turn instead of failing:
// 25 puts at 20/s with a burst of 5 all succeed, and the rate still holds
// (the 20 past the burst take at least about a second).
func TestWritesWaitTheirTurn(t *testing.T) {
	o := servertest.Options{}
	o.Server.WriteRate, o.Server.WriteBurst = 20, 5
	_, _, cli := start(t, o)
	ctx := ctxOf(t)
	start := time.Now()
	for i := range 25 {
		if _, err := cli.Put(ctx, fmt.Sprint("/wait/k", i), "v"); err != nil {
			t.Fatalf("put %d over the rate: %v, want it to wait its turn", i, err)
		}
	}
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Errorf("25 puts at 20/s (burst 5) took %v, want at least about 1 s: the rate is not kept", d)
	}
}

// TestRateWaitersBounded: one writer parks at most 16 writes waiting their
// turn; the rest of a burst is refused at once, not after the wait (each
// waiting write holds a goroutine and its request).
func TestRateWaitersBounded(t *testing.T) {
	o := servertest.Options{}
	o.Server.WriteRate, o.Server.WriteBurst = 2, 1
	_, _, cli := start(t, o)
	ctx := ctxOf(t)
	const n = 40
	var (
		mu      sync.Mutex
		quickNo int // refused within 300 ms
	)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			start := time.Now()
			_, err := cli.Put(ctx, fmt.Sprint("/burst/k", i), "v")
			if codeOf(err) == codes.ResourceExhausted && time.Since(start) < 300*time.Millisecond {
				mu.Lock()
				quickNo++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if quickNo < n-1-16 {
		t.Errorf("%d of %d writes over the rate refused at once, want at least %d (16 may wait, 1 passes)", quickNo, n, n-1-16)
	}
}
