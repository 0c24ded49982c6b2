package etcd_test

import (
	"fmt"
	"testing"
	"time"

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
