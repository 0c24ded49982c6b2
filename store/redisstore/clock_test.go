package redisstore

import (
	"testing"
	"time"
)

// TestRedisClock: the mapping follows the sample with the smallest error
// bound, a slow round trip does not displace a recent quick one, a
// sample no bound accounts for (another clock) restarts it, and times
// map along the node's clock from the kept sample.
func TestRedisClock(t *testing.T) {
	var c redisClock
	t0 := time.Now()
	if got, _, ok := c.mapped(t0); ok {
		t.Fatalf("before any sample: %d, want it not mapped", got)
	}
	const redis0 = 1_000_000_000 // Redis's clock, far from this node's
	want := func(what string, at time.Time, ms int64) {
		t.Helper()
		if got, _, ok := c.mapped(at); !ok || got != ms {
			t.Fatalf("%s: %d %v, want %d", what, got, ok, ms)
		}
	}
	// A quick round trip: Redis read 1,000,000,000 ms at its midpoint.
	c.sample(t0, t0.Add(10*time.Millisecond), redis0, "a")
	want("a second after the quick sample", t0.Add(5*time.Millisecond+time.Second), redis0+1000)
	// A round trip of 4 s a minute later (a storm), Redis reading its
	// clock within it: its bound (2 s) is far worse than the quick one's
	// (5 ms + a minute's drift), so the mapping stays.
	later := t0.Add(time.Minute)
	c.sample(later, later.Add(4*time.Second), redis0+60_000+3_000, "a")
	want("after a slow sample", later, redis0+60_000-5)
	// A quicker one that agrees within the bounds replaces it: the
	// mapping moves by the 2 ms the two disagree.
	c.sample(later, later.Add(2*time.Millisecond), redis0+59_998, "a")
	want("after a quicker sample", later.Add(time.Millisecond), redis0+59_998)
	// Hours on, drift outweighs the old sample's quickness: a slower
	// sample (100 ms) 20 ms off the mapping replaces it.
	hours := later.Add(3 * time.Hour)
	mapped := redis0 + 59_998 + (3*time.Hour + 49*time.Millisecond).Milliseconds()
	c.sample(hours, hours.Add(100*time.Millisecond), mapped+20, "a")
	want("hours later", hours.Add(50*time.Millisecond), mapped+20)
	// A quick sample that no bound accounts for: Redis's clock is
	// another now (a failover to a replica 40 s behind).
	failover := hours.Add(time.Minute)
	at := mapped + 20 + (time.Minute + time.Millisecond - 50*time.Millisecond).Milliseconds()
	c.sample(failover, failover.Add(2*time.Millisecond), at-40_000, "b")
	want("after a failover", failover.Add(time.Millisecond), at-40_000)
	// A slow sample within its bounds does not move it.
	c.sample(failover, failover.Add(time.Second), at-40_000+400, "b")
	want("after a slow sample", failover.Add(time.Millisecond), at-40_000)
	// Nonsense is ignored.
	c.sample(failover, failover.Add(-time.Second), 42, "b")
	c.sample(failover, failover, 0, "b")
	want("after bad samples", failover.Add(time.Millisecond), at-40_000)
	// A failover to a process whose clock agrees within the bounds: a
	// slow sample of it still restarts the mapping, which names it.
	c.sample(failover, failover.Add(time.Second), at-40_000+500, "c")
	want("after a failover to an agreeing clock", failover.Add(500*time.Millisecond), at-40_000+500)
	if _, id, _ := c.mapped(failover); id != "c" {
		t.Fatalf("the mapping names clock %q, want c", id)
	}
}
