package server

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// What a protocol served outside this package (server/etcd: the etcd v3
// gRPC API) needs of the node: the same token rules, the one write path
// and the TTL leases every other surface uses. Errors are *Error, as the
// WebSocket and HTTP surfaces answer them.

// GRPCListener wraps ln, the listener of another protocol (the etcd
// API's gRPC), with the node's connection limits: its connections count
// with the node's others, per client address too, and past the limit are
// closed at accept (the reserve is for the HTTP health checks).
func (s *Server) GRPCListener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, s: s, noReserve: true}
}

// Engine returns the node's room engine, for reads and watches.
func (s *Server) Engine() *rooms.Engine { return s.engine }

// Limits returns the store's write limits.
func (s *Server) Limits() store.Limits { return s.storeLimits() }

// Identify returns the claims of a bearer token a client at addr
// presented ("" for none: anonymous when the node runs without auth).
// Its error is one of package auth's (auth.ErrTokenMissing, …) or the
// connect hook's.
func (s *Server) Identify(ctx context.Context, token, addr string) (*auth.Claims, error) {
	claims, err := s.identify(ctx, token, nil, "grpc", addr)
	if err != nil {
		s.metrics.authFailures.Inc()
	}
	return claims, err
}

// ValidUntil is when the token of claims stops being accepted (its exp
// plus the leeway), when a stream opened with it must end, as a
// WebSocket session and an SSE stream do; zero without auth.
func (s *Server) ValidUntil(claims *auth.Claims) time.Time {
	if !s.authEnabled() {
		return time.Time{}
	}
	return s.validUntil(claims)
}

// Write lets a write of claims' writer at addr in (the node is not
// shutting down, the writer is under the write rate) and applies it to
// room through the one write path: permissions, leases (TTL lease ids),
// the validation hook, metrics.
func (s *Server) Write(ctx context.Context, room string, w store.Write, claims *auth.Claims, addr string) (store.Result, error) {
	if err := s.admitWait(ctx, claims, addr); err != nil {
		return store.Result{}, err
	}
	writer := writerKey(claims, addr)
	res, err := s.apply(ctx, room, w, claims, writer, nil)
	s.chargeWrite(writer, w, err)
	if err != nil {
		return res, errorOf(err, true)
	}
	return res, nil
}

// Compact drops room's history below rev on this node (rooms.Engine.Compact)
// for claims' writer at addr; it counts as a write, so a client compacts
// no faster than it writes. It returns the room's head.
func (s *Server) Compact(ctx context.Context, room string, rev uint64, claims *auth.Claims, addr string) (uint64, error) {
	if err := s.admitWait(ctx, claims, addr); err != nil {
		return 0, err
	}
	return s.engine.Compact(ctx, room, rev)
}

// GrantLease grants TTL lease id (chosen by the caller: unguessable, and
// starting with "ttl_") to claims' subject; it counts as a write.
func (s *Server) GrantLease(ctx context.Context, id string, ttl time.Duration, claims *auth.Claims, addr string) error {
	if !strings.HasPrefix(id, ttlLeasePrefix) {
		return newError(wire.CodeBadRequest, "a TTL lease id starts with "+ttlLeasePrefix)
	}
	if ttl < minLeaseTTL || ttl > maxLeaseTTL {
		return newError(wire.CodeBadRequest, "a lease's TTL must be between "+minLeaseTTL.String()+" and "+maxLeaseTTL.String())
	}
	if err := s.admitWait(ctx, claims, addr); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	defer cancel()
	ok, err := s.leases.grantID(ctx, id, ttl, claims.Subject)
	switch {
	case err != nil:
		return s.leaseStoreErr("grant", err)
	case !ok:
		return newError(wire.CodeTooLarge, "too many TTL leases for this subject: revoke one or let one expire")
	}
	return nil
}

// KeepAliveLease renews TTL lease id of claims' subject and returns its TTL.
func (s *Server) KeepAliveLease(ctx context.Context, id string, claims *auth.Claims) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	defer cancel()
	ttl, u, err := s.leases.keepAlive(ctx, id, claims.Subject)
	if err != nil {
		return 0, s.leaseStoreErr("keep-alive", err)
	}
	if u != leaseOK {
		return 0, leaseErr(id, u)
	}
	return ttl, nil
}

// RevokeLease ends TTL lease id of claims' subject and deletes its keys
// before it returns; it counts as a write.
func (s *Server) RevokeLease(ctx context.Context, id string, claims *auth.Claims, addr string) error {
	if err := s.admitWait(ctx, claims, addr); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.StoreTimeout)
	defer cancel()
	_, u, err := s.leases.revoke(ctx, id, claims.Subject)
	if err != nil {
		return s.leaseStoreErr("revoke", err)
	}
	if u != leaseOK {
		return leaseErr(id, u)
	}
	return nil
}

// LeaseInfo is what a node knows of a TTL lease.
type LeaseInfo struct {
	TTL time.Duration // granted
	// Left is the time until it ends unless kept alive; negative when
	// the node cannot tell (on a shared store the deadline is Redis's).
	Left time.Duration
	// Keys written under it (room, key), when the node holds the lease
	// (not on a shared store).
	Keys [][2]string
}

// Lease returns TTL lease id of claims' subject.
func (s *Server) Lease(ctx context.Context, id string, claims *auth.Claims) (LeaseInfo, error) {
	l := s.leases
	if l.sharedTTL(id) {
		st, err := l.shared.Lease(ctx, id)
		if err != nil {
			return LeaseInfo{}, s.leaseStoreErr("check", err)
		}
		if u := stateUse(st, claims.Subject); u != leaseOK {
			return LeaseInfo{}, leaseErr(id, u)
		}
		return LeaseInfo{TTL: st.TTL, Left: -1}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.leases[id]
	if ls != nil && ls.ttl == 0 {
		ls = nil // a session lease is not a TTL lease
	}
	if u := ls.use(claims.Subject); u != leaseOK {
		return LeaseInfo{}, leaseErr(id, u)
	}
	info := LeaseInfo{TTL: ls.ttl, Left: max(0, time.Until(ls.deadline))}
	for k := range ls.keys {
		info.Keys = append(info.Keys, [2]string{k.room, k.key})
	}
	return info, nil
}

// Leases returns the ids starting with prefix of the TTL leases of
// claims' subject.
func (s *Server) Leases(ctx context.Context, prefix string, claims *auth.Claims) ([]string, error) {
	l := s.leases
	var ids []string
	if l.shared != nil {
		all, err := l.shared.LeaseIDs(ctx)
		if err != nil {
			return nil, s.leaseStoreErr("check", err)
		}
		for _, id := range all {
			if !strings.HasPrefix(id, prefix) {
				continue
			}
			if st, err := l.shared.Lease(ctx, id); err == nil && stateUse(st, claims.Subject) == leaseOK {
				ids = append(ids, id)
			}
		}
		return ids, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, ls := range l.leases {
		if ls.ttl > 0 && strings.HasPrefix(id, prefix) && ls.use(claims.Subject) == leaseOK {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// LocalLease is the lease id of a lease name a key carries
// (store.KV.Lease): the TTL lease id a client granted, whichever node
// the key was written through.
func LocalLease(stored string) string {
	if i := strings.LastIndexByte(stored, '/'); i >= 0 {
		return stored[i+1:]
	}
	return stored
}

// maxRateWait bounds how long admitWait holds a write over its writer's
// rate, and maxRateWaiters how many of one writer's it holds at once.
const (
	maxRateWait    = 2 * time.Second
	maxRateWaiters = 16
)

// admitWait is admitWrite for the etcd API. Its clients do not retry
// ResourceExhausted (client/v3 retries no write, and its recipes fail on
// it), so a write over its writer's rate waits its turn, up to maxRateWait
// or the request's deadline, as etcd's own backpressure slows a client
// down rather than failing it: the rate is kept, by the writer's pace.
// One that would wait longer, or past half the time left before the
// request's deadline (the other half is the write's), is refused as before; so is one past the
// writer's maxRateWaiters waiting already, which bounds what a writer can
// park on the node (each holds a goroutine and its request).
func (s *Server) admitWait(ctx context.Context, claims *auth.Claims, addr string) error {
	retry, err := s.admitWrite(claims, addr)
	var pe *Error
	if err == nil || !errors.As(err, &pe) || pe.Code != wire.CodeRateLimited {
		return err
	}
	now := time.Now()
	deadline := now.Add(maxRateWait)
	if d, ok := ctx.Deadline(); ok && now.Add(d.Sub(now)/2).Before(deadline) {
		deadline = now.Add(d.Sub(now) / 2) // the other half is the write's
	}
	writer := writerKey(claims, addr)
	if time.Now().Add(retry).After(deadline) || !s.rateWaits.enter(writer, maxRateWaiters) {
		return err
	}
	defer s.rateWaits.leave(writer)
	for {
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		if retry, err = s.admitWrite(claims, addr); err == nil || !errors.As(err, &pe) || pe.Code != wire.CodeRateLimited ||
			time.Now().Add(retry).After(deadline) {
			return err
		}
	}
}
