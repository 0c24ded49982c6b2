package rooms

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/statecast/statecast/store"
)

// PageOptions bounds one page of a list.
type PageOptions struct {
	// After, when set, starts the page at the first key after it.
	After string
	// Rev, when set, reads the keys at that revision rather than the
	// head, from the retained history: the pages of one list all read
	// the first page's revision, however the room moves meanwhile. A
	// revision older than the history is a *store.CompactedError; one
	// past the head, ErrFutureRevision.
	Rev uint64
	// Limit is the most keys (0: no limit); MaxBytes the most bytes of
	// keys and values, counted as ItemBytes (0: no limit). A page holds
	// at least one key.
	Limit, MaxBytes int
	// Keep, when set, keeps only the keys it returns true for.
	Keep func(store.KV) bool
	// From and To, when set, bound the keys to those from From up to, not
	// including, To: the walk starts at From and stops at To, so a narrow
	// range of a large prefix costs the range.
	From, To string
}

// ItemBytes is what a key counts toward PageOptions.MaxBytes: its key,
// value and the fields around them.
func ItemBytes(kv store.KV) int { return len(kv.Key) + len(kv.Value) + 64 }

// Page is one page of a list: Items at Rev (sorted by key), and More
// when keys follow the last one.
type Page struct {
	store.Snapshot
	More bool
	Head uint64 // the room's head revision, whichever Rev the page reads
}

// ListPage returns a page of the keys of room under prefix, as o says,
// from this node's view once it is as fresh as opts asks. It costs the
// page, not the room: it walks the view from o.After and stops at the
// page's bounds, and a page at a past revision undoes only the retained
// events since then.
func (e *Engine) ListPage(ctx context.Context, room, prefix string, o PageOptions, opts ReadOptions) (Page, error) {
	if err := store.ValidRoom(room); err != nil {
		return Page{}, err
	}
	r, err := e.ready(ctx, room, opts)
	if err != nil {
		return Page{}, err
	}
	r.hist.expire(time.Now())
	if len(r.watchers) == 0 {
		r.idleSince = time.Now()
	}
	view := r.view.Clone()
	p := Page{Snapshot: store.Snapshot{Epoch: r.epoch, Rev: r.head, Oldest: r.hist.oldest}, Head: r.head}
	var past map[string]*store.KV
	if o.Rev != 0 && o.Rev != r.head {
		past, err = r.pastLocked(prefix, o.After, o.Rev)
		p.Rev = o.Rev
	}
	r.mu.Unlock()
	if err != nil {
		return Page{}, err
	}

	// The keys written since Rev, in order, merged with the view's keys.
	changed := make([]string, 0, len(past))
	for k := range past {
		if k >= o.From && (o.To == "" || k < o.To) {
			changed = append(changed, k)
		}
	}
	slices.Sort(changed)
	bytes := 0
	full := func() bool {
		return len(p.Items) > 0 && (o.Limit > 0 && len(p.Items) >= o.Limit || o.MaxBytes > 0 && bytes >= o.MaxBytes)
	}
	add := func(kv store.KV) bool { // false: the page is full and kv follows it
		if o.Keep != nil && !o.Keep(kv) {
			return true
		}
		if full() || o.MaxBytes > 0 && len(p.Items) > 0 && bytes+ItemBytes(kv) > o.MaxBytes {
			p.More = true
			return false
		}
		p.Items = append(p.Items, kv)
		bytes += ItemBytes(kv)
		return true
	}
	from := max(prefix, o.After+"\x00", o.From)
	if o.After == "" {
		from = max(prefix, o.From)
	}
	view.AscendGreaterOrEqual(store.KV{Key: from}, func(kv store.KV) bool {
		if !strings.HasPrefix(kv.Key, prefix) || o.To != "" && kv.Key >= o.To {
			return false
		}
		for len(changed) > 0 && changed[0] <= kv.Key {
			if old := past[changed[0]]; old != nil && !add(*old) {
				return false
			}
			changed = changed[1:]
		}
		if _, ok := past[kv.Key]; ok {
			return true // its state at Rev was added above, or it did not exist
		}
		return add(kv)
	})
	for !p.More && len(changed) > 0 {
		if old := past[changed[0]]; old != nil && !add(*old) {
			break
		}
		changed = changed[1:]
	}
	return p, nil
}

// pastLocked returns, for each key under prefix after after that events
// since rev changed, its state at rev (nil: it did not exist), from the
// retained history: the first such event's previous value.
func (r *room) pastLocked(prefix, after string, rev uint64) (map[string]*store.KV, error) {
	if rev > r.head {
		return nil, ErrFutureRevision
	}
	if rev+1 < r.hist.oldest {
		return nil, &store.CompactedError{Oldest: r.hist.oldest}
	}
	past := make(map[string]*store.KV)
	a, b := r.hist.segments(r.hist.find(rev + 1))
	for _, run := range [][]slot{a, b} {
		for _, s := range run {
			if _, seen := past[s.key]; seen || !strings.HasPrefix(s.key, prefix) || s.key <= after {
				continue
			}
			for _, ev := range s.ch.Events {
				if ev.KV.Key == s.key {
					past[s.key] = ev.Prev
					break
				}
			}
		}
	}
	return past, nil
}
