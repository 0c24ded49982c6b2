package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/statecast/statecast/store"
)

// claimState is what this node knows of a hook's claim, kept by the loop.
// One node at a time delivers a hook: the one whose write of claim/<hook>
// is the key's current version. It renews the claim by writing beat/<hook>
// (conditional on the claim), and another node takes the claim over once
// neither key has changed for ClaimTimeout by its own clock, so the nodes'
// clocks need not agree.
type claimState struct {
	held    uint64 // our claim's mod_rev; 0 when not ours
	seen    uint64 // the claim key's mod_rev as last seen; 0: none
	holder  string // the node named by the claim last seen
	changed time.Time
	renewed time.Time // our last successful renewal
}

func (c *claimState) reset(now time.Time) {
	c.seen, c.holder, c.changed = 0, "", now
}

type claimValue struct {
	Node string `json:"node"`
}

// observe notes a change of the internal room that concerns the hook's
// claim. A claim written by someone else ends ours.
func (h *hook) observe(ev store.Event, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch ev.KV.Key {
	case claimKey(h.id):
		if ev.KV.ModRev < max(h.claim.seen, h.claim.held) {
			// Older than what a conflict or our own take told us: the
			// followed batches lag the store's answers on Redis.
			return
		}
		h.claim.seen, h.claim.changed, h.claim.holder = 0, now, ""
		if ev.Type == store.OpPut {
			var v claimValue
			_ = json.Unmarshal(ev.KV.Value, &v)
			h.claim.seen, h.claim.holder = ev.KV.ModRev, v.Node
		}
		if h.claim.held != 0 && h.claim.seen != h.claim.held {
			h.w.cfg.Logger.Warn("webhooks: another node took the hook's claim", "hook", h.id, "node", h.claim.holder)
			h.lost = true // released by the loop, outside this lock
		}
	case beatKey(h.id):
		h.claim.changed = now
	}
}

// claims renews the claims this node holds and takes those whose holder
// is gone.
func (w *Webhooks) claims(ctx context.Context) {
	now := time.Now()
	for _, h := range w.hooks {
		if h.claimLost() {
			h.release()
		}
		if h.claim.held != 0 {
			h.renew(ctx, now)
			continue
		}
		if h.claim.seen == 0 || !w.cfg.Shared || now.Sub(h.claim.changed) > w.cfg.ClaimTimeout {
			h.take(ctx, now)
		}
	}
}

// renew writes the beat under the claim. A conflict means the claim is no
// longer ours; a store that stays unreachable for ClaimTimeout makes this
// node step down, since the others will take the claim meanwhile.
func (h *hook) renew(ctx context.Context, now time.Time) {
	_, err := h.writeUnderClaim(ctx, beatKey(h.id), h.claim.held)
	switch {
	case err == nil:
		h.mu.Lock()
		h.claim.renewed = now
		h.mu.Unlock()
		if h.run == nil {
			h.startRun(ctx)
		}
	case errors.Is(err, store.ErrConflict):
		h.w.cfg.Logger.Warn("webhooks: lost the hook's claim", "hook", h.id)
		h.release()
	case now.Sub(h.claim.renewed) > h.w.cfg.ClaimTimeout:
		h.w.cfg.Logger.Warn("webhooks: could not renew the hook's claim in time; stepping down", "hook", h.id, "err", err)
		h.release()
	}
}

// take writes the claim, conditional on the version last seen, and starts
// delivering from the cursors in the store.
func (h *hook) take(ctx context.Context, now time.Time) {
	res, err := h.writeUnderClaim(ctx, claimKey(h.id), h.claim.seen)
	var conflict *store.ConflictError
	switch {
	case errors.As(err, &conflict):
		// Someone wrote the claim since: count its silence from now.
		h.mu.Lock()
		h.claim.seen, h.claim.changed = conflict.ModRev, now
		h.mu.Unlock()
		return
	case err != nil:
		h.setErr(err)
		return
	}
	h.mu.Lock()
	h.claim.held, h.claim.seen, h.claim.holder, h.claim.renewed, h.claim.changed = res.Rev, res.Rev, h.w.cfg.Node, now, now
	h.mu.Unlock()
	h.w.cfg.Logger.Info("webhooks: took the hook's claim", "hook", h.id, "pattern", h.spec.Pattern, "url", redact(h.spec.URL))
	h.startRun(ctx)
}

// writeUnderClaim puts this node's name at key if the claim key is at
// modRev: a beat (modRev: our claim) or a takeover (the claim last seen).
func (h *hook) writeUnderClaim(ctx context.Context, key string, modRev uint64) (store.Result, error) {
	v, _ := json.Marshal(claimValue{Node: h.w.cfg.Node})
	wctx, cancel := context.WithTimeout(ctx, h.w.cfg.ClaimTimeout/2)
	defer cancel()
	return h.w.st.Apply(wctx, InternalRoom, store.Write{
		Conds: []store.Cond{{Key: claimKey(h.id), ModRev: modRev}},
		Ops:   []store.Op{{Type: store.OpPut, Key: key, Value: v}},
	})
}

// startRun starts delivering from the cursors in the store, read after the
// claim was taken: the last holder can have moved none since.
func (h *hook) startRun(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, h.w.cfg.ClaimTimeout/2)
	defer cancel()
	cursors, err := readCursors(rctx, h.w.st, h.id)
	if err != nil {
		h.setErr(err) // the next renewal tries again
		return
	}
	h.setErr(nil)
	h.start(cursors)
}

// redact hides a URL's password and query (which may carry a token).
func redact(u string) string {
	if i := strings.IndexByte(u, '?'); i >= 0 {
		u = u[:i] + "?…"
	}
	return u
}
