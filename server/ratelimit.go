package server

import (
	"container/list"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/wire"
)

// maxWriteLimiters bounds how many writers' buckets are kept: past it the
// least recently used one is dropped. A dropped bucket that was not full
// gives its writer a fresh burst, which only matters to a client cycling
// through more subjects or addresses than this within a few seconds.
const maxWriteLimiters = 1 << 17

// writeLimits is the one write rate limit of every surface (WebSocket
// writes, HTTP key writes and transactions): a token bucket per writer
// (its token's subject, or its address when anonymous), so a client gets
// no more by opening more sockets or switching to HTTP. Buckets live in
// an LRU list; ones idle long enough to have refilled are dropped, since
// a fresh bucket is the same.
type writeLimits struct {
	limit  rate.Limit
	burst  int
	refill time.Duration    // an idle bucket is full again after this
	now    func() time.Time // time.Now; tests fix it

	mu  sync.Mutex
	lru *list.List // of *writeBucket, most recently used first
	m   map[string]*list.Element
}

type writeBucket struct {
	key  string
	lim  *rate.Limiter
	used time.Time
}

func newWriteLimits(perSecond float64, burst int) *writeLimits {
	return &writeLimits{
		limit: rate.Limit(perSecond), burst: burst,
		refill: time.Duration(float64(burst) / perSecond * float64(time.Second)),
		lru:    list.New(), m: make(map[string]*list.Element), now: time.Now,
	}
}

// allow takes one write from key's bucket; when it is empty, retry says
// when the next write would be allowed.
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
		b = &writeBucket{key: key, lim: rate.NewLimiter(l.limit, l.burst)}
		l.m[key] = l.lru.PushFront(b)
	}
	b.used = now
	if b.lim.AllowN(now, 1) {
		return true, 0
	}
	missing := 1 - b.lim.TokensAt(now)
	return false, time.Duration(missing / float64(l.limit) * float64(time.Second))
}

// dropIdle removes a few of the least recently used buckets that have
// refilled: a constant amount of work per call keeps the list short when
// writers come and go.
func (l *writeLimits) dropIdle(now time.Time) {
	for range 2 {
		el := l.lru.Back()
		if el == nil || now.Sub(el.Value.(*writeBucket).used) < l.refill {
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
	return newError(wire.CodeRateLimited, fmt.Sprintf("more than %g writes per second by this client (its token's subject, or its address when anonymous); retry later", s.cfg.WriteRate))
}
