package redisstore

import (
	"testing"
	"time"
)

// TestRedisClock: the mapping follows the sample with the smallest error
// bound, a slow round trip does not displace a recent quick one, and
// times map along the node's clock from the kept sample.
func TestRedisClock(t *testing.T) {
	var c redisClock
	t0 := time.Now()
	if got := c.redisMS(t0); got != t0.UnixMilli() {
		t.Fatalf("before any sample: %d, want the node's clock %d", got, t0.UnixMilli())
	}
	const redis0 = 1_000_000_000 // Redis's clock, far from this node's
	// A quick round trip: Redis read 1,000,000,000 ms at its midpoint.
	c.sample(t0, t0.Add(10*time.Millisecond), redis0)
	if got := c.redisMS(t0.Add(5*time.Millisecond + time.Second)); got != redis0+1000 {
		t.Fatalf("a second after the quick sample: %d, want %d", got, redis0+1000)
	}
	// A round trip of 4 s a minute later (a storm): its error bound (2 s)
	// is far worse than the quick one's (5 ms + a minute's drift), and
	// Redis read its clock within it.
	later := t0.Add(time.Minute)
	c.sample(later, later.Add(4*time.Second), redis0+60_000+3_000)
	if got := c.redisMS(later); got != redis0+60_000-5 {
		t.Fatalf("after a slow sample: %d, want the quick one kept (%d)", got, redis0+60_000-5)
	}
	// A quicker round trip still replaces it.
	c.sample(later, later.Add(2*time.Millisecond), redis0+70_000)
	if got := c.redisMS(later.Add(time.Millisecond)); got != redis0+70_000 {
		t.Fatalf("after a quicker sample: %d, want %d", got, redis0+70_000)
	}
	// Hours on, drift outweighs the old sample's quickness.
	hours := later.Add(3 * time.Hour)
	c.sample(hours, hours.Add(100*time.Millisecond), redis0+5)
	if got := c.redisMS(hours.Add(50 * time.Millisecond)); got != redis0+5 {
		t.Fatalf("hours later: %d, want the new sample (%d)", got, redis0+5)
	}
	// A quick sample that the kept one cannot account for: Redis's
	// clock is another now (a failover to a replica 40 s behind).
	failover := hours.Add(time.Minute)
	c.sample(failover, failover.Add(2*time.Millisecond), redis0+5+60_000-40_000)
	if got := c.redisMS(failover.Add(time.Millisecond)); got != redis0+5+20_000 {
		t.Fatalf("after a failover: %d, want the new clock (%d)", got, redis0+5+20_000)
	}
	// A slow sample within its bounds does not move it.
	c.sample(failover, failover.Add(time.Second), redis0+5+20_000+400)
	if got := c.redisMS(failover.Add(time.Millisecond)); got != redis0+5+20_000 {
		t.Fatalf("after a slow sample: %d, want %d", got, redis0+5+20_000)
	}
	hours = failover
	// Nonsense is ignored.
	c.sample(hours, hours.Add(-time.Second), 42)
	c.sample(hours, hours, 0)
	if got := c.redisMS(hours.Add(time.Millisecond)); got != redis0+5+20_000 {
		t.Fatalf("after bad samples: %d, want %d", got, redis0+5+20_000)
	}
}
