package storetest

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"sync"
	"testing"

	"github.com/statecast/statecast/store"
)

// testRevision: each room has its own revision, 0 when never written, +1
// per committed write; a transaction is one revision.
func testRevision(t *testing.T, s *suite) {
	parallel(t,
		namedTest{"NeverWrittenRoomIsRevZero", func(t *testing.T) {
			st := s.open(t, Config{})
			snap := snapshot(t, st, "fresh", "")
			if snap.Epoch == "" {
				t.Error("Snapshot.Epoch is empty, want a non-empty epoch")
			}
			snap.Epoch = ""
			diff(t, "Snapshot of a never-written room", store.Snapshot{Rev: 0, Oldest: 1}, snap)
			diff(t, "History(1) of a never-written room", []store.Batch(nil), history(t, st, "fresh", 1, 0))

			// Following a room does not write it.
			follow(t, st, "followed")
			snap = snapshot(t, st, "followed", "")
			snap.Epoch = ""
			diff(t, "Snapshot of a followed, never-written room", store.Snapshot{Rev: 0, Oldest: 1}, snap)
		}},
		namedTest{"EachWriteBumpsByOne", func(t *testing.T) {
			st := s.open(t, Config{})
			epoch := snapshot(t, st, "bump", "").Epoch
			for i := uint64(1); i <= 10; i++ {
				var res store.Result
				if i%3 == 0 {
					res = del(t, st, "bump", fmt.Sprintf("k%d", i-1))
				} else {
					res = put(t, st, "bump", fmt.Sprintf("k%d", i), "v")
				}
				if res.Rev != i || res.Epoch != epoch || len(res.Events) != 1 {
					t.Fatalf("write %d: Result rev %d epoch %q with %d events, want rev %d epoch %q with 1 event",
						i, res.Rev, res.Epoch, len(res.Events), i, epoch)
				}
				if got := head(t, st, "bump"); got != i {
					t.Fatalf("after write %d: Snapshot.Rev = %d, want %d", i, got, i)
				}
			}
		}},
		namedTest{"TransactionIsOneRevision", func(t *testing.T) {
			st := s.open(t, Config{})
			put(t, st, "txn", "old", "o")  // rev 1
			put(t, st, "txn", "keep", "k") // rev 2
			res := apply(t, st, "txn", txn(opPut("b", "1"), opDel("old"), opPut("a", "2"), opPut("keep", "3")))
			old, keep := kv("old", "o", 1, 1, 1), kv("keep", "k", 2, 2, 1)
			wantEvents := []store.Event{ // in the Write's op order, all at rev 3
				{Type: store.OpPut, KV: kv("b", "1", 3, 3, 1)},
				{Type: store.OpDelete, KV: store.KV{Key: "old", ModRev: 3}, Prev: &old},
				{Type: store.OpPut, KV: kv("a", "2", 3, 3, 1)},
				{Type: store.OpPut, KV: kv("keep", "3", 2, 3, 2), Prev: &keep},
			}
			diff(t, "Result", store.Result{Epoch: res.Epoch, Rev: 3, Events: wantEvents}, res)
			bs := history(t, st, "txn", 3, 0)
			if len(bs) != 1 {
				t.Fatalf("History(3) returned %d batches, want 1 (the transaction)", len(bs))
			}
			diff(t, "History(3) batch", res, asResult(bs[0]))
			diff(t, "Snapshot", []store.KV{kv("a", "2", 3, 3, 1), kv("b", "1", 3, 3, 1), kv("keep", "3", 2, 3, 2)},
				snapshot(t, st, "txn", "").Items)
			if h := head(t, st, "txn"); h != 3 {
				t.Errorf("head = %d, want 3", h)
			}
		}},
		namedTest{"EpochIsStable", func(t *testing.T) {
			st := s.open(t, Config{})
			rec := follow(t, st, "epoch")
			epoch := snapshot(t, st, "epoch", "").Epoch
			if epoch == "" {
				t.Fatal("Snapshot.Epoch is empty")
			}
			var got []string
			for i := range 3 {
				got = append(got, put(t, st, "epoch", fmt.Sprint("k", i), "v").Epoch)
			}
			got = append(got, snapshot(t, st, "epoch", "").Epoch)
			for _, b := range history(t, st, "epoch", 1, 0) {
				got = append(got, b.Epoch)
			}
			for _, b := range rec.waitRev(t, 3) {
				got = append(got, b.Epoch)
			}
			want := make([]string, len(got))
			for i := range want {
				want[i] = epoch
			}
			diff(t, "epochs of results, snapshot, history and follow", want, got)
		}},
		namedTest{"RoomsAreIndependent", func(t *testing.T) {
			st := s.open(t, Config{})
			recB := follow(t, st, "room-b")
			for i := range 3 {
				put(t, st, "room-a", "k", fmt.Sprint("a", i))
			}
			res := put(t, st, "room-b", "k", "b0")
			if res.Rev != 1 {
				t.Errorf("first write to room-b committed at rev %d, want 1", res.Rev)
			}
			del(t, st, "room-a", "k")
			if h := head(t, st, "room-a"); h != 4 {
				t.Errorf("room-a head = %d, want 4", h)
			}
			diff(t, "room-b snapshot", []store.KV{kv("k", "b0", 1, 1, 1)}, snapshot(t, st, "room-b", "").Items)
			diff(t, "room-b history", []store.Result{res}, resultsOf(history(t, st, "room-b", 1, 0)))
			diff(t, "room-b follow", []store.Result{res}, resultsOf(recB.waitRev(t, 1)))
			diff(t, "room-a snapshot", []store.KV(nil), snapshot(t, st, "room-a", "").Items)
		}},
	)
}

func resultsOf(bs []store.Batch) []store.Result {
	out := make([]store.Result, len(bs))
	for i, b := range bs {
		out[i] = asResult(b)
	}
	return out
}

// testKeyRevisions: create_rev, mod_rev and version as etcd's KeyValue;
// Prev on events; a delete is a tombstone event; deleting a missing key
// writes nothing.
func testKeyRevisions(t *testing.T, s *suite) {
	parallel(t,
		namedTest{"CreateModVersion", func(t *testing.T) {
			st := s.open(t, Config{})
			steps := []struct {
				write store.Write
				want  []store.KV // the room's items afterwards
			}{
				{store.Put("k", []byte("v1")), []store.KV{kv("k", "v1", 1, 1, 1)}},                               // create: version 1
				{store.Put("k", []byte("v2")), []store.KV{kv("k", "v2", 1, 2, 2)}},                               // put: version +1, create_rev kept
				{store.Put("other", []byte("x")), []store.KV{kv("k", "v2", 1, 2, 2), kv("other", "x", 3, 3, 1)}}, // other keys untouched
				{store.Put("k", []byte("v3")), []store.KV{kv("k", "v3", 1, 4, 3), kv("other", "x", 3, 3, 1)}},
				{store.Delete("k"), []store.KV{kv("other", "x", 3, 3, 1)}},
				{store.Put("k", []byte("v4")), []store.KV{kv("k", "v4", 6, 6, 1), kv("other", "x", 3, 3, 1)}}, // re-create: new create_rev, version reset
				{store.Put("k", []byte("v5")), []store.KV{kv("k", "v5", 6, 7, 2), kv("other", "x", 3, 3, 1)}},
			}
			for i, step := range steps {
				apply(t, st, "kv", step.write)
				diff(t, fmt.Sprintf("items after step %d", i+1), step.want, snapshot(t, st, "kv", "").Items)
			}
		}},
		namedTest{"EventsCarryPrev", func(t *testing.T) {
			st := s.open(t, Config{})
			v1, v2, v3 := kv("k", "v1", 1, 1, 1), kv("k", "v2", 1, 2, 2), kv("k", "v3", 4, 4, 1)
			got := []store.Result{
				put(t, st, "prev", "k", "v1"),
				put(t, st, "prev", "k", "v2"),
				del(t, st, "prev", "k"),
				put(t, st, "prev", "k", "v3"),
				apply(t, st, "prev", txn(opPut("k", "v4"), opPut("new", "n"))),
			}
			epoch := got[0].Epoch
			want := []store.Result{
				{Epoch: epoch, Rev: 1, Events: []store.Event{{Type: store.OpPut, KV: v1}}},
				{Epoch: epoch, Rev: 2, Events: []store.Event{{Type: store.OpPut, KV: v2, Prev: &v1}}},
				{Epoch: epoch, Rev: 3, Events: []store.Event{{Type: store.OpDelete, KV: store.KV{Key: "k", ModRev: 3}, Prev: &v2}}},
				{Epoch: epoch, Rev: 4, Events: []store.Event{{Type: store.OpPut, KV: v3}}}, // no Prev: the key did not exist
				{Epoch: epoch, Rev: 5, Events: []store.Event{
					{Type: store.OpPut, KV: kv("k", "v4", 4, 5, 2), Prev: &v3},
					{Type: store.OpPut, KV: kv("new", "n", 5, 5, 1)},
				}},
			}
			diff(t, "Results", want, got)
			diff(t, "History", want, resultsOf(history(t, st, "prev", 1, 0)))
		}},
		namedTest{"DeleteIsTombstoneEvent", func(t *testing.T) {
			st := s.open(t, Config{})
			put(t, st, "tomb", "k", "v")
			put(t, st, "tomb", "j", "w")
			res := del(t, st, "tomb", "k")
			prev := kv("k", "v", 1, 1, 1)
			// A tombstone: the key, ModRev = the delete's revision, no value, Version 0.
			want := store.Result{Epoch: res.Epoch, Rev: 3, Events: []store.Event{
				{Type: store.OpDelete, KV: store.KV{Key: "k", ModRev: 3}, Prev: &prev},
			}}
			diff(t, "Result of delete", want, res)
			diff(t, "History(3)", []store.Result{want}, resultsOf(history(t, st, "tomb", 3, 0)))
			diff(t, "items after delete", []store.KV{kv("j", "w", 2, 2, 1)}, snapshot(t, st, "tomb", "").Items)
		}},
		namedTest{"DeleteMissingKeyWritesNothing", func(t *testing.T) {
			st := s.open(t, Config{})
			put(t, st, "miss", "k", "v")
			del(t, st, "miss", "k") // rev 2
			rec := follow(t, st, "miss")
			before := snapshot(t, st, "miss", "")
			beforeHist := history(t, st, "miss", 1, 0)
			for _, w := range []store.Write{
				store.Delete("never"),
				store.Delete("k"), // deleted already
				txn(opDel("never"), opDel("k"), opDel("other")),
			} {
				res := apply(t, st, "miss", w)
				diff(t, fmt.Sprintf("Result of %+v", w), store.Result{Epoch: before.Epoch, Rev: 2}, res)
			}
			checkUnchanged(t, st, "miss", before, beforeHist)
			// The follower saw nothing of it: the next batch it gets is rev 3.
			put(t, st, "miss", "after", "x")
			diff(t, "revisions followed", []uint64{3}, revs(rec.waitRev(t, 3)))

			// A never-written room stays at rev 0.
			res := apply(t, st, "miss-fresh", store.Delete("k"))
			diff(t, "Result of deleting in a never-written room", store.Result{Epoch: res.Epoch, Rev: 0}, res)
			if h := head(t, st, "miss-fresh"); h != 0 {
				t.Errorf("never-written room head = %d after deleting a missing key, want 0", h)
			}
		}},
		namedTest{"DeleteMissingKeyInTransactionHasNoEvent", func(t *testing.T) {
			st := s.open(t, Config{})
			put(t, st, "txmiss", "k", "v")
			res := apply(t, st, "txmiss", txn(opDel("missing"), opPut("a", "1"), opDel("k")))
			prev := kv("k", "v", 1, 1, 1)
			want := store.Result{Epoch: res.Epoch, Rev: 2, Events: []store.Event{
				{Type: store.OpPut, KV: kv("a", "1", 2, 2, 1)},
				{Type: store.OpDelete, KV: store.KV{Key: "k", ModRev: 2}, Prev: &prev},
			}}
			diff(t, "Result", want, res)
			diff(t, "History(2)", []store.Result{want}, resultsOf(history(t, st, "txmiss", 2, 0)))
		}},
	)
}

// testConditions: writes conditional on mod_rev (0 = must not exist).
func testConditions(t *testing.T, s *suite) {
	// setup writes k (rev 1, then rev 2), gone (rev 3, deleted at rev 4).
	setup := func(t *testing.T) store.Store {
		st := s.open(t, Config{})
		put(t, st, "cond", "k", "v1")
		put(t, st, "cond", "k", "v2")
		put(t, st, "cond", "gone", "g")
		del(t, st, "cond", "gone")
		return st
	}
	cond := func(key string, modRev uint64) store.Cond { return store.Cond{Key: key, ModRev: modRev} }
	succeeds := func(t *testing.T, st store.Store, w store.Write, wantRev uint64) {
		t.Helper()
		res, err := st.Apply(bg, "cond", w)
		if err != nil {
			t.Fatalf("Apply(%+v): %v, want success", w, err)
		}
		if res.Rev != wantRev {
			t.Errorf("Apply(%+v) committed at rev %d, want %d", w, res.Rev, wantRev)
		}
	}
	// conflicts checks the conflict and that nothing was written.
	conflicts := func(t *testing.T, st store.Store, w store.Write, key string, modRev uint64) {
		t.Helper()
		rec := follow(t, st, "cond")
		before := snapshot(t, st, "cond", "")
		beforeHist := history(t, st, "cond", 1, 0)
		_, err := st.Apply(bg, "cond", w)
		wantConflict(t, err, key, modRev, before.Rev)
		checkUnchanged(t, st, "cond", before, beforeHist)
		put(t, st, "cond", "probe", "p")
		diff(t, "revisions followed after a conflict", []uint64{before.Rev + 1}, revs(rec.waitRev(t, before.Rev+1)))
	}
	parallel(t,
		namedTest{"MustNotExistSucceedsOnMissingKey", func(t *testing.T) {
			st := setup(t)
			succeeds(t, st, store.Write{Conds: []store.Cond{cond("new", 0)}, Ops: []store.Op{opPut("new", "n")}}, 5)
			// A deleted key does not exist either.
			succeeds(t, st, store.Write{Conds: []store.Cond{cond("gone", 0)}, Ops: []store.Op{opPut("gone", "again")}}, 6)
			diff(t, "re-created key", kv("gone", "again", 6, 6, 1), snapshot(t, st, "cond", "gone").Items[0])
		}},
		namedTest{"MustNotExistFailsOnExistingKey", func(t *testing.T) {
			st := setup(t)
			conflicts(t, st, store.Write{Conds: []store.Cond{cond("k", 0)}, Ops: []store.Op{opPut("k", "x")}}, "k", 2)
		}},
		namedTest{"MatchingModRevSucceeds", func(t *testing.T) {
			st := setup(t)
			succeeds(t, st, store.Write{Conds: []store.Cond{cond("k", 2)}, Ops: []store.Op{opPut("k", "v3")}}, 5)
			// The condition may be on a key the write does not touch.
			succeeds(t, st, store.Write{Conds: []store.Cond{cond("k", 5)}, Ops: []store.Op{opPut("z", "z"), opDel("k")}}, 6)
			diff(t, "items", []store.KV{kv("z", "z", 6, 6, 1)}, snapshot(t, st, "cond", "").Items)
		}},
		namedTest{"StaleModRevConflicts", func(t *testing.T) {
			st := setup(t)
			conflicts(t, st, store.Write{Conds: []store.Cond{cond("k", 1)}, Ops: []store.Op{opPut("k", "x")}}, "k", 2)
		}},
		namedTest{"FutureModRevConflicts", func(t *testing.T) {
			st := setup(t)
			conflicts(t, st, store.Write{Conds: []store.Cond{cond("k", 99)}, Ops: []store.Op{opDel("k")}}, "k", 2)
		}},
		namedTest{"ModRevOnMissingKeyConflicts", func(t *testing.T) {
			st := setup(t)
			// gone was at mod_rev 3 before its delete; now it does not exist.
			conflicts(t, st, store.Write{Conds: []store.Cond{cond("gone", 3)}, Ops: []store.Op{opPut("gone", "x")}}, "gone", 0)
			conflicts(t, st, store.Write{Conds: []store.Cond{cond("never", 1)}, Ops: []store.Op{opPut("never", "x")}}, "never", 0)
		}},
		namedTest{"FirstFailingConditionIsReported", func(t *testing.T) {
			st := setup(t)
			w := store.Write{
				Conds: []store.Cond{cond("k", 2), cond("gone", 0), cond("never", 7), cond("k", 1)},
				Ops:   []store.Op{opPut("a", "1"), opPut("b", "2")},
			}
			conflicts(t, st, w, "never", 0)
		}},
		namedTest{"ConflictingTransactionWritesNothing", func(t *testing.T) {
			st := setup(t)
			w := store.Write{
				Conds: []store.Cond{cond("k", 2), cond("gone", 4)},
				Ops:   []store.Op{opPut("k", "x"), opDel("k2"), opPut("new", "n")},
			}
			conflicts(t, st, w, "gone", 0)
		}},
		namedTest{"ConditionsOnlyWriteDoesNotBump", func(t *testing.T) {
			st := setup(t)
			rec := follow(t, st, "cond")
			before := snapshot(t, st, "cond", "")
			beforeHist := history(t, st, "cond", 1, 0)
			res := apply(t, st, "cond", store.Write{Conds: []store.Cond{cond("k", 2), cond("gone", 0)}})
			diff(t, "Result of a conditions-only write", store.Result{Epoch: before.Epoch, Rev: 4}, res)
			checkUnchanged(t, st, "cond", before, beforeHist)
			// And a failing one is a conflict.
			_, err := st.Apply(bg, "cond", store.Write{Conds: []store.Cond{cond("k", 1)}})
			wantConflict(t, err, "k", 2, 4)
			put(t, st, "cond", "probe", "p")
			diff(t, "revisions followed", []uint64{5}, revs(rec.waitRev(t, 5)))
		}},
		namedTest{"ConditionNamingItsOwnRoomIsAllowed", func(t *testing.T) {
			st := setup(t)
			succeeds(t, st, store.Write{
				Conds: []store.Cond{{Room: "cond", Key: "k", ModRev: 2}},
				Ops:   []store.Op{opPut("k", "v3")},
			}, 5)
		}},
		namedTest{"ConcurrentCompareAndSwap", func(t *testing.T) {
			st := s.open(t, Config{})
			const room, writers, increments = "cas", 4, 25
			put(t, st, room, "counter", "0")
			var wg sync.WaitGroup
			errc := make(chan error, writers)
			for range writers {
				wg.Go(func() {
					for done := 0; done < increments; {
						snap, err := st.Snapshot(bg, room, "counter")
						if err != nil {
							errc <- err
							return
						}
						cur := snap.Items[0]
						var n int
						fmt.Sscan(string(cur.Value), &n)
						_, err = st.Apply(bg, room, store.Write{
							Conds: []store.Cond{{Key: "counter", ModRev: cur.ModRev}},
							Ops:   []store.Op{opPut("counter", fmt.Sprint(n+1))},
						})
						switch {
						case err == nil:
							done++
						case errors.Is(err, store.ErrConflict):
						default:
							errc <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Fatalf("compare-and-swap: %v", err)
			}
			total := uint64(writers * increments)
			diff(t, "counter", []store.KV{kv("counter", fmt.Sprint(total), 1, total+1, total+1)},
				snapshot(t, st, room, "").Items)
		}},
	)
}

// testSnapshot: sorted by key, filtered by prefix, consistent at one
// revision.
func testSnapshot(t *testing.T, s *suite) {
	// Written in an order that is not sorted; sorted byte-wise they are:
	keys := []string{"B", "a", "a/1", "a/10", "a/2", "ab", "b", "z", "é"}
	setup := func(t *testing.T) store.Store {
		st := s.open(t, Config{})
		for _, k := range []string{"b", "a/2", "é", "a", "z", "a/10", "B", "ab", "a/1"} {
			put(t, st, "snap", k, "v:"+k)
		}
		return st
	}
	keysOf := func(kvs []store.KV) []string {
		var out []string
		for _, kv := range kvs {
			out = append(out, kv.Key)
		}
		return out
	}
	parallel(t,
		namedTest{"SortedByKey", func(t *testing.T) {
			st := setup(t)
			snap := snapshot(t, st, "snap", "")
			diff(t, "keys", keys, keysOf(snap.Items))
			if snap.Rev != uint64(len(keys)) || snap.Oldest != 1 {
				t.Errorf("Snapshot rev %d oldest %d, want rev %d oldest 1", snap.Rev, snap.Oldest, len(keys))
			}
			state := map[string]store.KV{}
			replay(state, history(t, st, "snap", 1, 0))
			diff(t, "items", items(state, ""), snap.Items)
		}},
		namedTest{"Prefix", func(t *testing.T) {
			st := setup(t)
			all := snapshot(t, st, "snap", "")
			for _, tc := range []struct {
				prefix string
				want   []string
			}{
				{"", keys},
				{"a/", []string{"a/1", "a/10", "a/2"}},
				{"a", []string{"a", "a/1", "a/10", "a/2", "ab"}},
				{"a/1", []string{"a/1", "a/10"}}, // a plain string prefix, not a path segment
				{"é", []string{"é"}},
				{"nope", nil},
				{"a/10/", nil},
			} {
				snap := snapshot(t, st, "snap", tc.prefix)
				diff(t, fmt.Sprintf("keys under %q", tc.prefix), tc.want, keysOf(snap.Items))
				diff(t, fmt.Sprintf("items under %q", tc.prefix), items(stateOf(all.Items), tc.prefix), snap.Items)
				if snap.Rev != all.Rev || snap.Oldest != all.Oldest || snap.Epoch != all.Epoch {
					t.Errorf("Snapshot(%q) at epoch %q rev %d oldest %d, want the room's epoch %q rev %d oldest %d",
						tc.prefix, snap.Epoch, snap.Rev, snap.Oldest, all.Epoch, all.Rev, all.Oldest)
				}
			}
		}},
		namedTest{"ConsistentUnderConcurrentWrites", func(t *testing.T) {
			// Writers keep every pair w<n>/x, w<n>/y equal; readers snapshot
			// all the while. Each snapshot must equal the history replayed
			// up to its Rev.
			st := s.open(t, Config{})
			const room, writers, minRevs = "consistent", 3, 300
			prefixes := []string{"", "w1/"}
			var (
				wg    sync.WaitGroup
				done  = make(chan struct{})
				snaps = make([][]store.Snapshot, len(prefixes))
				errc  = make(chan error, writers+len(prefixes))
			)
			for w := range writers {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-done:
							return
						default:
						}
						x, y := fmt.Sprintf("w%d/x", w), fmt.Sprintf("w%d/y", w)
						wr := txn(opPut(x, fmt.Sprint(i)), opPut(y, fmt.Sprint(i)), opPut("shared", fmt.Sprint(w, i)))
						if i%5 == 4 {
							wr = txn(opDel(x), opDel(y))
						}
						if _, err := st.Apply(bg, room, wr); err != nil {
							errc <- err
							return
						}
					}
				})
			}
			for i, prefix := range prefixes {
				wg.Go(func() {
					for {
						snap, err := st.Snapshot(bg, room, prefix)
						if err != nil {
							errc <- err
							return
						}
						// Keep every snapshot but exact repeats of the last one.
						if n := len(snaps[i]); n == 0 || !reflect.DeepEqual(snaps[i][n-1], snap) {
							snaps[i] = append(snaps[i], snap)
						}
						select {
						case <-done:
							return
						default:
						}
					}
				})
			}
			stopAll := sync.OnceFunc(func() { close(done); wg.Wait() })
			t.Cleanup(stopAll)
			rec := follow(t, st, room)
			rec.waitRev(t, minRevs)
			stopAll()
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}
			snap := snapshot(t, st, room, "")
			hist := history(t, st, room, 1, 0)
			if diff(t, "history revisions", span(1, snap.Rev), revs(hist)) {
				t.FailNow()
			}
			// stateAt[r] is the room at revision r, replayed from history.
			stateAt := []map[string]store.KV{{}}
			for _, b := range hist {
				next := maps.Clone(stateAt[len(stateAt)-1])
				replay(next, []store.Batch{b})
				stateAt = append(stateAt, next)
			}
			for i, prefix := range prefixes {
				for _, snap := range snaps[i] {
					if diff(t, fmt.Sprintf("Snapshot(%q) at rev %d vs history replayed to it", prefix, snap.Rev),
						items(stateAt[snap.Rev], prefix), snap.Items) {
						return
					}
				}
			}
		}},
	)
}
