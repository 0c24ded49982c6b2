package redisstore

import (
	"sync"
	"time"
)

// redisClock maps this node's clock onto the Redis server's (TIME), so
// that times the nodes stamp compare across nodes whatever their own
// clocks say (the order of a client's connects, TakeSession).
//
// It learns from round trips that read TIME (the registry's beats and
// reads): Redis read its clock at some instant of the round trip, so a
// sample's error is at most half the round trip; it grows after by how
// far two clocks may drift apart (maxDrift). The sample with the
// smallest error bound now is kept, as NTP keeps its best: a reconnect
// storm that slows the beats for a while leaves the mapping as good as
// the last quick beat, unless a sample disagrees with it beyond both
// bounds: then Redis's clock is another (a failover) and the mapping
// starts again from that sample. Times are carried on the monotonic
// clock, so a step of the node's wall clock does not move the mapping.
type redisClock struct {
	mu  sync.Mutex
	ok  bool
	at  time.Time     // the sample's midpoint, on this node's clock
	ms  int64         // Redis's clock then, unix ms
	rtt time.Duration // the sample's round trip
	id  string        // the Redis process read (its run_id; '' unknown)
}

// maxDrift bounds how fast two computers' clocks drift apart (ordinary
// quartz clocks: tens of parts per million).
const maxDrift = 200e-6

// errorAt bounds the mapping's error at t. Called with mu held.
func (c *redisClock) errorAt(t time.Time) time.Duration {
	return c.rtt/2 + time.Duration(float64(t.Sub(c.at).Abs())*maxDrift)
}

// sample learns from a round trip sent at sent and answered at recv, in
// which the clock of Redis process id read ms. A sample of another
// process (a failover) starts the mapping again.
func (c *redisClock) sample(sent, recv time.Time, ms int64, id string) {
	rtt := recv.Sub(sent)
	if rtt < 0 || ms <= 0 {
		return
	}
	mid := sent.Add(rtt / 2)
	c.mu.Lock()
	defer c.mu.Unlock()
	// A sample the kept one cannot account for within both error bounds
	// (plus a millisecond of rounding) read another clock: a failover to
	// a replica, or Redis's clock stepped. The mapping follows it.
	jumped := c.ok && (id != c.id || time.Duration((ms-c.ms)*int64(time.Millisecond)-int64(mid.Sub(c.at))).Abs() > c.errorAt(mid)+rtt/2+time.Millisecond)
	if !c.ok || jumped || rtt/2 <= c.errorAt(mid) {
		c.ok, c.at, c.ms, c.rtt, c.id = true, mid, ms, rtt, id
	}
}

// mapped is t on Redis's clock, in unix ms, with the Redis process whose
// clock that is; false before any sample: then nothing is known of it.
func (c *redisClock) mapped(t time.Time) (int64, string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ok {
		return 0, "", false
	}
	return c.ms + t.Sub(c.at).Milliseconds(), c.id, true
}
