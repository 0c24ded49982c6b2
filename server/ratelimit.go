package server

import (
	"container/list"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// maxWriteLimiters bounds how many writers' buckets are kept: past it the
// least recently used one is dropped. A dropped bucket that was not full
// gives its writer a fresh burst, which only matters to a client cycling
// through more subjects or addresses than this within a few seconds.
const maxWriteLimiters = 1 << 17

// writeLimits is the one write rate limit of every surface (WebSocket
// writes, HTTP key writes and transactions): a token bucket per writer
// (its token's subject, or its address when anonymous), so a client gets
// no more by opening more sockets or switching to HTTP. A write is let in
// while its writer's bucket holds a unit (allow); once the store planned
// it (committed, or refused for a condition or the quota) it is charged
// the rest of its cost (Server.chargeWrite, writeCost): a large write may
// leave the bucket in debt, which the writer's next writes wait out, so
// any valid write gets in and a writer's units per second stay bounded by
// the rate. An invalid write costs its one unit. Buckets live in
// an LRU list; ones idle long enough to have refilled are dropped, since
// a fresh bucket is the same.
type writeLimits struct {
	rate  float64 // units per second
	burst float64
	now   func() time.Time // time.Now; tests fix it

	mu  sync.Mutex
	lru *list.List // of *writeBucket, most recently used first
	m   map[string]*list.Element
}

type writeBucket struct {
	key    string
	tokens float64   // at time at; negative: in debt
	at     time.Time // when tokens was last brought up to date
}

func newWriteLimits(perSecond float64, burst int) *writeLimits {
	return &writeLimits{
		rate: perSecond, burst: float64(burst),
		lru: list.New(), m: make(map[string]*list.Element), now: time.Now,
	}
}

// tokensAt is what b holds at now.
func (l *writeLimits) tokensAt(b *writeBucket, now time.Time) float64 {
	return min(l.burst, b.tokens+now.Sub(b.at).Seconds()*l.rate)
}

// allow takes one unit from key's bucket; when it holds less, retry says
// when it will hold one.
func (l *writeLimits) allow(key string) (ok bool, retry time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropIdle(now)
	var b *writeBucket
	if el := l.m[key]; el != nil {
		l.lru.MoveToFront(el)
		b = el.Value.(*writeBucket)
	} else {
		if l.lru.Len() >= maxWriteLimiters {
			old := l.lru.Remove(l.lru.Back()).(*writeBucket)
			delete(l.m, old.key)
		}
		b = &writeBucket{key: key, tokens: l.burst, at: now}
		l.m[key] = l.lru.PushFront(b)
	}
	b.tokens, b.at = l.tokensAt(b, now), now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// charge takes n more units from key's bucket (one allow let in), into
// debt when it holds fewer. A bucket dropped meanwhile is not charged.
func (l *writeLimits) charge(key string, n int) {
	if n <= 0 {
		return
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if el := l.m[key]; el != nil {
		b := el.Value.(*writeBucket)
		b.tokens, b.at = l.tokensAt(b, now)-float64(n), now
	}
}

// writeUnitBytes is the bytes of keys and values one unit of the write
// rate pays for: at the default 200 units a second, 12.5 MiB/s per writer.
const writeUnitBytes = 64 << 10

// writeCost is what w costs in units of the write rate: one per op, or
// one per writeUnitBytes of its keys and values when that is more; at
// least 1. A 256-put transaction costs 256, a 256 KiB value 4, 256 puts
// of 256 KiB 1,024.
func writeCost(w store.Write) int {
	n := 0
	for _, op := range w.Ops {
		n += len(op.Key) + len(op.Value)
	}
	return max(1, len(w.Ops), (n+writeUnitBytes-1)/writeUnitBytes)
}

// dropIdle removes a few of the least recently used buckets that have
// refilled: a constant amount of work per call keeps the list short when
// writers come and go.
func (l *writeLimits) dropIdle(now time.Time) {
	for range 2 {
		el := l.lru.Back()
		if el == nil || l.tokensAt(el.Value.(*writeBucket), now) < l.burst {
			return
		}
		delete(l.m, l.lru.Remove(el).(*writeBucket).key)
	}
}

// len returns how many buckets are kept (for tests).
func (l *writeLimits) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lru.Len()
}

// writerKey names whose bucket a write takes from: the token's subject,
// or for anonymous clients (and tokens without one) the client's
// address. IPv6 clients are grouped by /64, the block one host usually
// gets: otherwise it could write from 2^64 addresses. The peer address is
// used as is: behind a proxy, anonymous clients share one bucket.
func writerKey(claims *auth.Claims, remoteAddr string) string {
	if claims != nil && claims.Subject != "" {
		return "sub:" + claims.Subject
	}
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	if !strings.Contains(host, ":") { // not IPv6: no need to parse it
		return "ip:" + host
	}
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		return "ip:" + ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return "ip:" + host
}

// rateLimited is the error of a refused write.
func (s *Server) rateLimited() *Error {
	s.metrics.rateLimited.Inc()
	return newError(wire.CodeRateLimited, fmt.Sprintf("more than %g writes per second by this client (its token's subject, or its address when anonymous; a write counts one per op or per 64 KiB of keys and values); retry later", s.cfg.WriteRate))
}
