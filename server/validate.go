package server

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/internal/wids"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// validated asks the validation hook (Config.Validate) about w, a write
// to room that the hook covers, before it commits (docs/HOOKS.md). It
// reads the current mod_rev of every key w touches or is conditional on
// and sends them; an allowed write comes back conditional on them, so it
// commits only if nothing the backend saw has changed (else it fails
// conflict like any failed condition). A write id that already committed
// answers its original outcome (dup) without asking the backend again.
// A refusal is forbidden with the backend's message; a backend that does
// not answer is unavailable. A writer (writerKey) with maxHookWaits writes
// waiting on the hook already is rate_limited. Nothing is written on any
// error.
func (s *Server) validated(ctx context.Context, room string, w store.Write, claims *auth.Claims, writer string, sess *session) (store.Write, *store.Result, error) {
	if !s.hookWaits.enter(writer, maxHookWaits) {
		return w, nil, newError(wire.CodeRateLimited, fmt.Sprintf("%d writes of this client (its token's subject, or its address when anonymous) are waiting on the application's validation hook already; retry once one is answered", maxHookWaits))
	}
	defer s.hookWaits.leave(writer)
	keys := touched(w)
	snap, err := s.engine.GetKeys(ctx, room, keys, rooms.ReadOptions{})
	if err != nil {
		if pe := errorOf(err, false); pe.Code != wire.CodeInternal {
			return w, nil, pe
		}
		return w, nil, causedBy(err, newError(wire.CodeUnavailable, "cannot read the keys the write touches for its validation; nothing was written"))
	}
	modRevs := make(map[string]uint64, len(keys))
	for _, key := range keys {
		modRevs[key] = 0
	}
	for _, kv := range snap.Items {
		modRevs[kv.Key] = kv.ModRev
	}
	if w.Wid != "" {
		if res, err := s.committedWid(ctx, room, w, keys[0], modRevs[keys[0]]); res != nil || err != nil {
			return w, res, err
		}
	}
	// A condition of the client's that fails now would fail at the
	// commit too (the checked value cannot come back): the backend is
	// not asked about a write that cannot commit.
	for _, c := range w.Conds {
		if modRevs[c.Key] != c.ModRev {
			return w, nil, &store.ConflictError{Key: c.Key, ModRev: modRevs[c.Key], Rev: snap.Rev, Epoch: snap.Epoch}
		}
	}
	checked := withModRevs(w, modRevs)
	if l, ok := s.store.(interface{ Limits() store.Limits }); ok {
		if err := l.Limits().Validate(room, checked); err != nil {
			return w, nil, err
		}
	}
	hctx, span := s.startSpan(ctx, "hook.validate", trace.SpanKindClient, room)
	verdict, err := s.cfg.Validate.Validate(hctx, validateRequest(room, w, modRevs, claims, sess))
	if span != nil {
		span.SetAttributes(attribute.Bool("statecast.allow", err == nil && verdict.Allow))
		endSpan(span, err)
	}
	switch {
	case err != nil:
		return w, nil, causedBy(err, newError(wire.CodeUnavailable, "the application's validation hook did not answer; nothing was written"))
	case !verdict.Allow:
		msg := verdict.Message
		if msg == "" {
			msg = "refused by the application"
		}
		return w, nil, newError(wire.CodeForbidden, msg)
	}
	return checked, nil, nil
}

// touched returns the keys w writes or is conditional on, each once.
func touched(w store.Write) []string {
	keys := make([]string, 0, len(w.Ops)+len(w.Conds))
	seen := make(map[string]bool, cap(keys))
	for _, op := range w.Ops {
		if !seen[op.Key] {
			seen[op.Key] = true
			keys = append(keys, op.Key)
		}
	}
	for _, c := range w.Conds {
		if !seen[c.Key] {
			seen[c.Key] = true
			keys = append(keys, c.Key)
		}
	}
	return keys
}

// withModRevs returns w conditional on modRevs for every key it writes
// that the client did not already make it conditional on (those equal
// modRevs: validated checked them).
func withModRevs(w store.Write, modRevs map[string]uint64) store.Write {
	conds := make([]store.Cond, len(w.Conds), len(w.Conds)+len(w.Ops))
	copy(conds, w.Conds)
	for _, op := range w.Ops {
		if !hasCond(w.Conds, op.Key) {
			conds = append(conds, store.Cond{Key: op.Key, ModRev: modRevs[op.Key]})
		}
	}
	w.Conds = conds
	return w
}

func hasCond(conds []store.Cond, key string) bool {
	for _, c := range conds {
		if c.Key == key {
			return true
		}
	}
	return false
}

// committedWid asks the store whether w's write id has committed, with a
// write of one condition that holds (key at modRev) under that id: the
// store checks the id first, in the same step, and a write that changes
// nothing is not remembered. It returns the original commit (dup), or
// the store's answer when the id cannot be decided (outcome_unknown);
// nil, nil when the id has not committed.
func (s *Server) committedWid(ctx context.Context, room string, w store.Write, key string, modRev uint64) (*store.Result, error) {
	probe := store.Write{Wid: w.Wid, Since: w.Since, Fingerprint: w.Fingerprint, LegacyWid: w.LegacyWid,
		Conds: []store.Cond{{Key: key, ModRev: modRev}}}
	if w.Wid != "" && probe.Fingerprint == "" {
		probe.Fingerprint = store.FingerprintOf(w) // the write's, not the probe's
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.StoreTimeout)
	defer cancel()
	res, err := s.engine.Apply(ctx, room, probe)
	var ce *store.ConflictError
	switch {
	case err == nil && res.Dup:
		return &res, nil
	case err == nil, errors.As(err, &ce):
		return nil, nil
	case errors.Is(err, store.ErrWidCompacted):
		return nil, err
	}
	if pe := errorOf(err, false); pe.Code != wire.CodeInternal {
		return nil, pe
	}
	return nil, newError(wire.CodeUnavailable, "the store is unreachable; nothing was written")
}

// validateRequest is the hook's view of w: its ops as the client spelt
// them ("session" for the writer's session lease).
func validateRequest(room string, w store.Write, modRevs map[string]uint64, claims *auth.Claims, sess *session) *hooks.ValidateRequest {
	req := &hooks.ValidateRequest{Subject: claims.Subject, Room: room, ModRevs: modRevs, Wid: wids.Client(w.Wid),
		Ops: make([]hooks.Op, len(w.Ops)), Conds: make([]hooks.Cond, len(w.Conds))}
	if sess != nil {
		req.Session = sess.id
	}
	for i, op := range w.Ops {
		o := hooks.Op{Type: "delete", Key: op.Key}
		if op.Type == store.OpPut {
			o.Type, o.Value, o.Lease = "put", op.Value, op.Lease
			if sess != nil && op.Lease == sess.lease {
				o.Lease = "session"
			}
		}
		req.Ops[i] = o
	}
	for i, c := range w.Conds {
		req.Conds[i] = hooks.Cond{Key: c.Key, ModRev: c.ModRev}
	}
	return req
}

// maxHookWaits bounds the writes of one writer waiting on the validation
// hook at once: without it, a writer's burst (400 by default) could all
// wait there together, each holding a goroutine and a request to the
// application.
const maxHookWaits = 16

// writerWaits counts each writer's writes waiting on something: the
// validation hook, or their turn under the write rate (admitWait).
type writerWaits struct {
	mu sync.Mutex
	n  map[string]int
}

// enter counts a write of writer in, unless max are in already.
func (h *writerWaits) enter(writer string, max int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n[writer] >= max {
		return false
	}
	if h.n == nil {
		h.n = make(map[string]int)
	}
	h.n[writer]++
	return true
}

func (h *writerWaits) leave(writer string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n[writer]--; h.n[writer] <= 0 {
		delete(h.n, writer)
	}
}
