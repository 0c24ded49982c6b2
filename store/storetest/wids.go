package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/statecast/statecast/store"
)

// withWid returns w carrying write id wid and, when since is not nil,
// the revision seen before it was first sent.
func withWid(w store.Write, wid string, since *uint64) store.Write {
	w.Wid, w.Since = wid, since
	return w
}

func revPtr(r uint64) *uint64 { return &r }

// wantWid fails unless every event of bs carries wid.
func wantWid(t testing.TB, what string, bs []store.Batch, wid string) {
	t.Helper()
	for _, b := range bs {
		for _, ev := range b.Events {
			if ev.Wid != wid {
				t.Errorf("%s: event of %q at revision %d carries wid %q, want %q", what, ev.KV.Key, b.Rev, ev.Wid, wid)
			}
		}
	}
}

// testWids: a write id (Write.Wid) makes a write idempotent within its
// room, atomically with the write; its events carry the id wherever they
// are read; Since bounds how far back a forgotten id may have committed.
func testWids(t *testing.T, s *suite) {
	parallel(t,
		namedTest{"RepeatIsDupWithOriginalRev", func(t *testing.T) {
			st := s.open(t, Config{})
			const room = "wids"
			rec := follow(t, st, room)
			put(t, st, room, "other", "0")
			first := apply(t, st, room, withWid(txn(opPut("a", "1"), opPut("b", "2")), "c1-7", nil))
			wantWid(t, "Apply's events", []store.Batch{{Rev: first.Rev, Events: first.Events}}, "c1-7")
			before := snapshot(t, st, room, "")
			hist := history(t, st, room, before.Oldest, 0)
			// The resend: the same write, with a since and other leases
			// (a retry on a new connection names its own).
			w := withWid(txn(opPut("a", "1"), opPut("b", "2")), "c1-7", revPtr(1))
			w.Ops[0].Lease = "another-connection"
			w.Ops[1].KeepLease = true // a kept lease is a lease too
			for range 2 {
				res, err := st.Apply(bg, room, w)
				if err != nil {
					t.Fatalf("repeated write: %v", err)
				}
				diff(t, "repeated write's result", store.Result{Epoch: first.Epoch, Rev: first.Rev, Dup: true}, res)
			}
			checkUnchanged(t, st, room, before, hist)
			next := put(t, st, room, "other", "1")
			bs := rec.waitRev(t, next.Rev)
			diff(t, "followed revisions", []uint64{1, 2, 3}, revs(bs))
			wantWid(t, "followed batch of the write", bs[1:2], "c1-7")
			wantWid(t, "followed batches without a wid", append(bs[:1:1], bs[2]), "")
			wantWid(t, "History of the write", history(t, st, room, first.Rev, 1), "c1-7")
		}},
		namedTest{"DeleteCarriesWid", func(t *testing.T) {
			st := s.open(t, Config{})
			put(t, st, "r", "k", "v")
			res := apply(t, st, "r", withWid(store.Delete("k"), "del-1", nil))
			wantWid(t, "History of a delete", history(t, st, "r", res.Rev, 0), "del-1")
			again := apply(t, st, "r", withWid(store.Delete("k"), "del-1", nil))
			diff(t, "repeated delete", store.Result{Epoch: res.Epoch, Rev: res.Rev, Dup: true}, again)
		}},
		namedTest{"ReusedWidIsRefused", func(t *testing.T) {
			// A repeat of a committed id must be the same write: with
			// other content it is another write under a reused id, refused
			// whole (nothing of it applies, its stale condition included),
			// never answered as the first one's commit.
			st := s.open(t, Config{})
			const room = "reused"
			first := apply(t, st, room, withWid(txn(opPut("a", "1"), opPut("b", "2")), "id-1", nil))
			before := snapshot(t, st, room, "")
			hist := history(t, st, room, before.Oldest, 0)
			cas := withWid(txn(opPut("a", "1"), opPut("b", "2")), "id-1", nil)
			cas.Conds = []store.Cond{{Key: "a", ModRev: 0}}
			for what, w := range map[string]store.Write{
				"another value":      withWid(txn(opPut("a", "1"), opPut("b", "3")), "id-1", revPtr(0)),
				"another key":        withWid(txn(opPut("a", "1"), opPut("c", "2")), "id-1", nil),
				"ops in other order": withWid(txn(opPut("b", "2"), opPut("a", "1")), "id-1", nil),
				"a delete":           withWid(txn(opPut("a", "1"), store.Op{Type: store.OpDelete, Key: "b"}), "id-1", nil),
				"a condition more":   cas,
			} {
				_, err := st.Apply(bg, room, w)
				var re *store.WidReusedError
				if !errors.As(err, &re) || !errors.Is(err, store.ErrWidReused) || re.Rev != first.Rev {
					t.Errorf("%s under a committed id: %v, want a *WidReusedError naming revision %d", what, err, first.Rev)
				}
			}
			checkUnchanged(t, st, room, before, hist)
			// The same content is still its repeat.
			again := apply(t, st, room, withWid(txn(opPut("a", "1"), opPut("b", "2")), "id-1", nil))
			diff(t, "the same write again", store.Result{Epoch: first.Epoch, Rev: first.Rev, Dup: true}, again)
		}},
		namedTest{"LegacyWidIsNoNewRecord", func(t *testing.T) {
			// LegacyWid finds only what an older build stored (no
			// fingerprint: the stores' upgrade tests write such records).
			// An id this build stored is another writer's, whatever its
			// text: a legacy id equal to it neither dedupes nor tells
			// that it committed.
			st := s.open(t, Config{})
			const room = "legacy"
			apply(t, st, room, withWid(store.Put("k", []byte("v")), "~alice~c.1", nil))
			w := withWid(store.Put("k", []byte("v")), "~bob~~alice~c.1", nil)
			w.LegacyWid = "~alice~c.1"
			if res := apply(t, st, room, w); res.Dup || res.Rev != 2 {
				t.Errorf("a legacy id naming this build's record: %+v, want applied at 2", res)
			}
			w.LegacyWid = "c.9" // the scoped id is now known: it decides
			if res := apply(t, st, room, w); !res.Dup || res.Rev != 2 {
				t.Errorf("repeat of the scoped id: %+v, want dup at 2", res)
			}
		}},
		namedTest{"RoomsAreIndependent", func(t *testing.T) {
			st := s.open(t, Config{})
			a := apply(t, st, "room-a", withWid(store.Put("k", []byte("a")), "same", nil))
			put(t, st, "room-b", "x", "1")
			b := apply(t, st, "room-b", withWid(store.Put("k", []byte("b")), "same", nil))
			if b.Dup || b.Rev != 2 || len(b.Events) != 1 {
				t.Errorf("same wid in another room: %+v, want applied at revision 2", b)
			}
			if again := apply(t, st, "room-a", withWid(store.Put("k", []byte("a")), "same", nil)); !again.Dup || again.Rev != a.Rev {
				t.Errorf("repeat in room-a: %+v, want dup at %d", again, a.Rev)
			}
		}},
		namedTest{"FailedOrNoOpWriteIsEvaluatedAgain", func(t *testing.T) {
			st := s.open(t, Config{})
			const room = "again"
			put(t, st, room, "k", "v")
			cas := withWid(store.Write{Conds: []store.Cond{{Key: "k", ModRev: 9}}, Ops: []store.Op{opPut("k", "w")}}, "cas-1", nil)
			_, err := st.Apply(bg, room, cas)
			wantConflict(t, err, "k", 1, 1)
			cas.Conds[0].ModRev = 1 // the repeat is evaluated again: now it holds
			if res := apply(t, st, room, cas); res.Dup || res.Rev != 2 {
				t.Errorf("repeat of a failed write: %+v, want applied at 2", res)
			}
			noop := withWid(store.Delete("missing"), "noop-1", nil)
			if res := apply(t, st, room, noop); res.Dup || res.Rev != 2 || len(res.Events) != 0 {
				t.Errorf("no-op write: %+v, want nothing at 2", res)
			}
			put(t, st, room, "missing", "now here")
			if res := apply(t, st, room, noop); res.Dup || res.Rev != 4 {
				t.Errorf("repeat of a no-op write: %+v, want applied at 4", res)
			}
		}},
		namedTest{"SinceBeyondCompactionIsUnknown", func(t *testing.T) {
			cfg := Config{Retention: store.RetentionPolicy{Default: store.Retention{MaxEvents: 2}}}
			st := s.open(t, cfg)
			const room = "since"
			lost := apply(t, st, room, withWid(store.Put("k", []byte("1")), "old", revPtr(0)))
			put(t, st, room, "k", "2")
			kept := apply(t, st, room, withWid(store.Put("k", []byte("3")), "kept", revPtr(2)))
			put(t, st, room, "k", "4") // revisions 3 and 4 retained
			checkOldest(t, st, room, 3)
			before := snapshot(t, st, room, "")
			hist := history(t, st, room, before.Oldest, 0)
			for _, since := range []uint64{0, 1} { // the first attempt may have committed at 1 or 2
				_, err := st.Apply(bg, room, withWid(store.Put("k", []byte("1")), "old", revPtr(since)))
				wantErrIs(t, fmt.Sprintf("unknown wid sent after %d, history from 3", since), err, store.ErrWidCompacted)
			}
			checkUnchanged(t, st, room, before, hist)
			// Still retained: known, whatever since says.
			if res := apply(t, st, room, withWid(store.Put("k", []byte("3")), "kept", revPtr(0))); !res.Dup || res.Rev != kept.Rev {
				t.Errorf("retained wid with an old since: %+v, want dup at %d", res, kept.Rev)
			}
			// Unknown, sent after 2: it could only have committed at 3 or later.
			if res := apply(t, st, room, withWid(store.Put("n", []byte("1")), "new", revPtr(2))); res.Dup || res.Rev != 5 {
				t.Errorf("unknown wid sent after a retained revision: %+v, want applied at 5", res)
			}
			// Without since, an unknown wid applies.
			if res := apply(t, st, room, withWid(store.Put("k", []byte("1")), "old", nil)); res.Dup || res.Rev == lost.Rev {
				t.Errorf("unknown wid without since: %+v, want applied anew", res)
			}
		}},
		namedTest{"ConcurrentSendsApplyOnce", func(t *testing.T) {
			st := s.open(t, Config{})
			const room = "race"
			rec := follow(t, st, room)
			ConcurrentSendsApplyOnce(t, room, st.Apply)
			diff(t, "followed revisions", []uint64{1}, revs(rec.waitRev(t, 1)))
			diff(t, "History", []uint64{1}, revs(history(t, st, room, 1, 0)))
		}},
		namedTest{"BadWid", func(t *testing.T) {
			st := s.open(t, Config{})
			for _, wid := range []string{strings.Repeat("w", store.MaxStoredWidBytes+1), "with space", "tab\t", "del\x7f", "é", "nul\x00"} {
				_, err := st.Apply(bg, "bad", withWid(store.Put("k", nil), wid, nil))
				wantErrIs(t, fmt.Sprintf("wid %q", wid), err, store.ErrInvalidWid)
			}
			_, err := st.Apply(bg, "bad", withWid(store.Put("k", nil), "", revPtr(3)))
			wantErrIs(t, "since without a wid", err, store.ErrInvalidWid)
			w := withWid(store.Put("k", nil), "id", nil)
			w.LegacyWid = strings.Repeat("l", store.MaxWidBytes+1)
			_, err = st.Apply(bg, "bad", w)
			wantErrIs(t, "a legacy id too long for a client's", err, store.ErrInvalidWid)
			ok := apply(t, st, "bad", withWid(store.Put("k", nil), strings.Repeat("~", store.MaxStoredWidBytes), nil))
			if ok.Rev != 1 {
				t.Errorf("the longest wid: %+v, want applied at 1", ok)
			}
			diff(t, "History after bad wids", []uint64{1}, revs(history(t, st, "bad", 1, 0)))
		}},
	)
	if s.f.Durable {
		t.Run("SurvivesReopen", func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			st := s.openDir(t, dir, Config{})
			first := apply(t, st, "r", withWid(store.Put("k", []byte("v")), "before-restart", revPtr(0)))
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			st = s.openDir(t, dir, Config{})
			res := apply(t, st, "r", withWid(store.Put("k", []byte("v")), "before-restart", revPtr(0)))
			diff(t, "repeat after reopen", store.Result{Epoch: first.Epoch, Rev: first.Rev, Dup: true}, res)
			_, err := st.Apply(bg, "r", withWid(store.Put("k", []byte("other")), "before-restart", nil))
			wantErrIs(t, "other content under the id after reopen", err, store.ErrWidReused)
			wantWid(t, "History after reopen", history(t, st, "r", 1, 0), "before-restart")
		})
	}
}

// ApplyFunc sends a write: a store's Apply, or a node's (rooms.Engine).
type ApplyFunc func(ctx context.Context, room string, w store.Write) (store.Result, error)

// ConcurrentSendsApplyOnce sends one write with one wid to an empty room
// from 16 goroutines spread over sends (stores open on the same data, as
// the nodes of one Redis are): exactly one applies, every other gets dup,
// and all name revision 1.
func ConcurrentSendsApplyOnce(t testing.TB, room string, sends ...ApplyFunc) {
	t.Helper()
	const n = 16
	var (
		wg      sync.WaitGroup
		results = make([]store.Result, n)
		errs    = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = sends[i%len(sends)](bg, room, withWid(store.Put("k", []byte("v")), "once", nil))
		})
	}
	wg.Wait()
	applied := 0
	for i, res := range results {
		if errs[i] != nil {
			t.Fatalf("send %d: %v", i, errs[i])
		}
		if !res.Dup {
			applied++
		}
		if res.Rev != 1 || res.Epoch != results[0].Epoch {
			t.Errorf("send %d: %+v, want revision 1 of epoch %q", i, res, results[0].Epoch)
		}
	}
	if applied != 1 {
		t.Errorf("%d of %d concurrent sends applied, want exactly 1", applied, n)
	}
}
