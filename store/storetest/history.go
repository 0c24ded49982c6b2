package storetest

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/statecast/statecast/store"
)

// testHistory: whole batches in revision order from `from` (inclusive),
// empty past the head, limits in whole batches.
func testHistory(t *testing.T, s *suite) {
	// setup writes five revisions of 1, 3, 1, 2 and 1 events.
	setup := func(t *testing.T) (store.Store, []store.Result) {
		st := s.open(t, Config{})
		return st, []store.Result{
			put(t, st, "hist", "a", "1"),
			apply(t, st, "hist", txn(opPut("b", "2"), opPut("c", "3"), opDel("a"))),
			put(t, st, "hist", "d", "4"),
			apply(t, st, "hist", txn(opPut("e", "5"), opPut("f", "6"))),
			del(t, st, "hist", "b"),
		}
	}
	parallel(t,
		namedTest{"MatchesApplyResults", func(t *testing.T) {
			st, results := setup(t)
			bs := history(t, st, "hist", 1, 0)
			diff(t, "History(1)", results, resultsOf(bs))
			for _, b := range bs {
				if b.Time.IsZero() {
					t.Errorf("batch %d has a zero commit Time", b.Rev)
				}
			}
		}},
		namedTest{"FromIsInclusive", func(t *testing.T) {
			st, results := setup(t)
			for from := uint64(1); from <= 5; from++ {
				diff(t, fmt.Sprintf("History(%d)", from), results[from-1:], resultsOf(history(t, st, "hist", from, 0)))
			}
		}},
		namedTest{"PastHeadIsEmpty", func(t *testing.T) {
			st, _ := setup(t)
			for _, from := range []uint64{6, 7, 1 << 40, math.MaxUint64} {
				if bs := history(t, st, "hist", from, 0); len(bs) != 0 {
					t.Errorf("History(%d) with head 5 returned revisions %v, want none", from, revs(bs))
				}
			}
			for _, from := range []uint64{1, 2} {
				if bs := history(t, st, "never-written", from, 0); len(bs) != 0 {
					t.Errorf("History(%d) of a never-written room returned revisions %v, want none", from, revs(bs))
				}
			}
		}},
		namedTest{"FromZeroIsBelowOldest", func(t *testing.T) {
			// Revision 0 holds no batch, so from=0 is below Oldest (1).
			st, _ := setup(t)
			_, err := st.History(bg, "hist", 0, 0)
			wantCompacted(t, err, 1)
			_, err = st.History(bg, "never-written", 0, 0)
			wantCompacted(t, err, 1)
		}},
		namedTest{"LimitReturnsWholeBatches", func(t *testing.T) {
			st, _ := setup(t)
			for _, tc := range []struct {
				from  uint64
				limit int
				want  []uint64
			}{
				{1, 0, span(1, 5)},  // no limit
				{1, -1, span(1, 5)}, // no limit
				{1, 1, []uint64{1}},
				{2, 1, []uint64{2}}, // a batch larger than limit is returned whole
				{2, 2, []uint64{2}},
				{1, 3, []uint64{1}}, // 1+3 events would exceed 3
				{1, 4, []uint64{1, 2}},
				{1, 5, []uint64{1, 2, 3}},
				{1, 6, []uint64{1, 2, 3}},
				{1, 7, []uint64{1, 2, 3, 4}},
				{1, 8, span(1, 5)},
				{1, 100, span(1, 5)},
				{3, 3, []uint64{3, 4}},
				{4, 1, []uint64{4}},
				{5, 1, []uint64{5}},
				{6, 1, nil},
			} {
				got := revs(history(t, st, "hist", tc.from, tc.limit))
				diff(t, fmt.Sprintf("History(from=%d, limit=%d) revisions", tc.from, tc.limit), tc.want, got)
			}
		}},
	)
}

// testRetention: compaction by event count (per room class) and by age;
// Snapshot.Oldest agrees with History.
func testRetention(t *testing.T, s *suite) {
	parallel(t,
		namedTest{"CompactionByEventCount", func(t *testing.T) {
			st := s.open(t, Config{Retention: store.RetentionPolicy{Default: store.Retention{MaxEvents: 5}}})
			var results []store.Result
			for i := range 20 {
				results = append(results, put(t, st, "compact", fmt.Sprintf("k%02d", i), fmt.Sprint(i)))
			}
			_, err := st.History(bg, "compact", 1, 0)
			wantCompacted(t, err, 16)
			_, err = st.History(bg, "compact", 15, 0)
			wantCompacted(t, err, 16)
			diff(t, "History(16)", results[15:], resultsOf(history(t, st, "compact", 16, 0)))
			checkOldest(t, st, "compact", 16)
			// Compaction drops history, never state.
			if n := len(snapshot(t, st, "compact", "").Items); n != 20 {
				t.Errorf("Snapshot has %d items after compaction, want 20", n)
			}
		}},
		namedTest{"TransactionCountsItsEvents", func(t *testing.T) {
			st := s.open(t, Config{Retention: store.RetentionPolicy{Default: store.Retention{MaxEvents: 5}}})
			put(t, st, "txcount", "a", "1")                                                 // rev 1: 1 event
			apply(t, st, "txcount", txn(opPut("b", "2"), opPut("c", "3"), opPut("d", "4"))) // rev 2: 3 events
			put(t, st, "txcount", "e", "5")                                                 // rev 3: 1 event, 5 in all
			checkOldest(t, st, "txcount", 1)
			put(t, st, "txcount", "f", "6") // 6 events: rev 1 goes
			checkOldest(t, st, "txcount", 2)
			put(t, st, "txcount", "g", "7") // 6 events: rev 2 goes whole (3 events)
			checkOldest(t, st, "txcount", 3)
			// A transaction larger than MaxEvents leaves no history behind it
			// but is still committed.
			res := apply(t, st, "txcount", txn(opPut("1", ""), opPut("2", ""), opPut("3", ""), opPut("4", ""), opPut("5", ""), opPut("6", "")))
			if res.Rev != 6 {
				t.Fatalf("large transaction committed at rev %d, want 6", res.Rev)
			}
			checkOldest(t, st, "txcount", 7)
			put(t, st, "txcount", "h", "8")
			checkOldest(t, st, "txcount", 7)
		}},
		namedTest{"RoomClasses", func(t *testing.T) {
			st := s.open(t, Config{Retention: store.RetentionPolicy{
				Default: store.Retention{MaxEvents: 10},
				Classes: []store.RoomClass{
					{Prefix: "lobby:", Retention: store.Retention{MaxEvents: 3}},
					{Prefix: "lobby:vip:", Retention: store.Retention{MaxEvents: 6}}, // the longest prefix wins
				},
			}})
			wantOldest := map[string]uint64{
				"lobby:eu":     10, // 12 writes, 3 kept
				"lobby:vip:eu": 7,  // 6 kept
				"doc:1":        3,  // default: 10 kept
				"lobby":        3,  // no class prefix matches "lobby"
			}
			for room := range wantOldest {
				for i := range 12 {
					put(t, st, room, fmt.Sprint("k", i), "v")
				}
			}
			for room, oldest := range wantOldest {
				checkOldest(t, st, room, oldest)
			}
		}},
		namedTest{"CompactionByAge", func(t *testing.T) {
			clock := newFakeClock()
			t0 := clock.Now()
			st := s.open(t, Config{
				Retention: store.RetentionPolicy{Default: store.Retention{MaxAge: 10 * time.Second}},
				Clock:     clock.Now,
			})
			put(t, st, "aged", "a", "1") // rev 1 at t0
			clock.Advance(4 * time.Second)
			put(t, st, "aged", "b", "2") // rev 2 at t0+4s
			clock.Advance(4 * time.Second)
			put(t, st, "aged", "c", "3") // rev 3 at t0+8s
			var times []time.Time
			for _, b := range history(t, st, "aged", 1, 0) {
				times = append(times, b.Time)
			}
			diff(t, "commit times from the Clock", []time.Time{t0, t0.Add(4 * time.Second), t0.Add(8 * time.Second)}, times)
			checkOldest(t, st, "aged", 1)

			clock.Advance(4 * time.Second) // t0+12s: rev 1 is 12s old
			checkOldest(t, st, "aged", 2)

			clock.Advance(time.Minute) // everything is too old
			checkOldest(t, st, "aged", 4)
			snap := snapshot(t, st, "aged", "")
			if snap.Rev != 3 || len(snap.Items) != 3 {
				t.Errorf("Snapshot after age compaction: rev %d with %d items, want rev 3 with 3 items", snap.Rev, len(snap.Items))
			}

			put(t, st, "aged", "d", "4") // rev 4, fresh
			checkOldest(t, st, "aged", 4)
		}},
		namedTest{"CompactionByBytes", func(t *testing.T) { testBytes(t, s, false) }},
		namedTest{"CompactionByBytesAcrossRestart", func(t *testing.T) { testBytes(t, s, true) }},
		namedTest{"AgeAndCountPerClass", func(t *testing.T) {
			clock := newFakeClock()
			st := s.open(t, Config{
				Retention: store.RetentionPolicy{
					Default: store.Retention{MaxEvents: 100},
					Classes: []store.RoomClass{{Prefix: "presence:", Retention: store.Retention{MaxEvents: 100, MaxAge: time.Second}}},
				},
				Clock: clock.Now,
			})
			for _, room := range []string{"presence:1", "doc:1"} {
				put(t, st, room, "k", "1")
				put(t, st, room, "k", "2")
			}
			clock.Advance(time.Hour)
			checkOldest(t, st, "presence:1", 3)
			checkOldest(t, st, "doc:1", 1)
		}},
	)
}

// testBytes: MaxBytes drops whole oldest revisions, per room class, and a
// revision larger than MaxBytes leaves nothing older replayable. Each
// backend counts bytes its own way (EventBytes, encoded records); the
// sizes here keep 4 revisions of a 10,000-byte value under 45,000 bytes
// by any measure whose per-event overhead is under 1,000 bytes. With
// restart, the store is reopened between writes: the count survives.
func testBytes(t *testing.T, s *suite, restart bool) {
	if restart && !s.f.Durable {
		t.Skip("the backend is not durable")
	}
	cfg := Config{Retention: store.RetentionPolicy{
		Default: store.Retention{MaxBytes: 45_000},
		Classes: []store.RoomClass{{Prefix: "wide:", Retention: store.Retention{MaxBytes: 95_000}}},
	}}
	dir := t.TempDir()
	st := s.openDir(t, dir, cfg)
	value := strings.Repeat("v", 10_000)
	var results []store.Result
	for i := range 12 {
		if restart && i%3 == 2 {
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			st = s.openDir(t, dir, cfg)
		}
		results = append(results, put(t, st, "bytes", fmt.Sprintf("k%02d", i), value)) // distinct keys: no previous values
		put(t, st, "wide:bytes", fmt.Sprintf("k%02d", i), value)
	}
	checkOldest(t, st, "bytes", 9) // revisions 9..12 kept
	checkOldest(t, st, "wide:bytes", 4)
	diff(t, "History(9)", results[8:], resultsOf(history(t, st, "bytes", 9, 0)))
	// Compaction drops history, never state.
	if n := len(snapshot(t, st, "bytes", "").Items); n != 12 {
		t.Errorf("Snapshot has %d items after compaction, want 12", n)
	}

	// One revision over MaxBytes is committed but leaves no history: not
	// even itself, so nothing older is replayable either.
	big := apply(t, st, "bytes", txn(opPut("b1", value), opPut("b2", value), opPut("b3", value), opPut("b4", value), opPut("b5", value)))
	if big.Rev != 13 {
		t.Fatalf("large revision committed at rev %d, want 13", big.Rev)
	}
	checkOldest(t, st, "bytes", 14)
	if restart {
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		st = s.openDir(t, dir, cfg)
	}
	put(t, st, "bytes", "after", value)
	checkOldest(t, st, "bytes", 14)
	for i := range 4 {
		put(t, st, "bytes", fmt.Sprint("more", i), value)
	}
	checkOldest(t, st, "bytes", 15)
}

// testFollow: every batch committed after registration, in order, exactly
// once, with History's content, and nothing after stop returns.
func testFollow(t *testing.T, s *suite) {
	parallel(t,
		namedTest{"OnlyBatchesAfterRegistration", func(t *testing.T) {
			st := s.open(t, Config{})
			for i := range 3 {
				put(t, st, "fol", fmt.Sprint("before", i), "v")
			}
			rec := follow(t, st, "fol")
			var results []store.Result
			results = append(results, put(t, st, "fol", "a", "1"))
			results = append(results, apply(t, st, "fol", txn(opPut("b", "2"), opDel("before0"))))
			results = append(results, del(t, st, "fol", "a"))
			got := rec.waitRev(t, 6)
			diff(t, "followed batches", results, resultsOf(got))
			diff(t, "followed batches vs History(4)", history(t, st, "fol", 4, 0), got)
		}},
		namedTest{"NoOpWritesAreNotDelivered", func(t *testing.T) {
			st := s.open(t, Config{})
			put(t, st, "noop", "k", "v")
			rec := follow(t, st, "noop")
			apply(t, st, "noop", store.Delete("missing"))
			apply(t, st, "noop", store.Write{Conds: []store.Cond{{Key: "k", ModRev: 1}}})
			if _, err := st.Apply(bg, "noop", store.Write{Conds: []store.Cond{{Key: "k", ModRev: 0}}, Ops: []store.Op{opPut("k", "x")}}); err == nil {
				t.Fatal("conflicting write succeeded")
			}
			if _, err := st.Apply(bg, "noop", store.Put("", nil)); err == nil {
				t.Fatal("write with an empty key succeeded")
			}
			put(t, st, "other-room", "k", "v")
			put(t, st, "noop", "k", "v2")
			diff(t, "followed revisions", []uint64{2}, revs(rec.waitRev(t, 2)))
		}},
		namedTest{"ManyFollowersEachGetEverything", func(t *testing.T) {
			st := s.open(t, Config{})
			recs := []*recorder{follow(t, st, "many"), follow(t, st, "many"), follow(t, st, "many")}
			for i := range 5 {
				put(t, st, "many", "k", fmt.Sprint(i))
			}
			want := history(t, st, "many", 1, 0)
			for i, rec := range recs {
				diff(t, fmt.Sprintf("follower %d", i), want, rec.waitRev(t, 5))
			}
		}},
		namedTest{"ConcurrentWritersExactlyOnceInOrder", func(t *testing.T) {
			st := s.open(t, Config{})
			const room, writers, writes = "busy", 4, 50
			recs := []*recorder{follow(t, st, room), follow(t, st, room)}
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				results []store.Result
				errc    = make(chan error, writers)
			)
			for w := range writers {
				wg.Go(func() {
					for i := range writes {
						wr := store.Put(fmt.Sprintf("w%d", w), []byte(fmt.Sprint(i)))
						if i%4 == 3 {
							wr = txn(opPut(fmt.Sprintf("w%d/a", w), "a"), opPut(fmt.Sprintf("w%d/b", w), "b"), opDel(fmt.Sprintf("w%d", w)))
						}
						res, err := st.Apply(bg, room, wr)
						if err != nil {
							errc <- err
							return
						}
						mu.Lock()
						results = append(results, res)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}
			const total = writers * writes
			hist := history(t, st, room, 1, 0)
			if diff(t, "history revisions", span(1, total), revs(hist)) {
				t.FailNow()
			}
			// Every Apply got its own revision and its batch is in History.
			for _, res := range results {
				diff(t, fmt.Sprintf("Result of rev %d vs History", res.Rev), asResult(hist[res.Rev-1]), res)
			}
			for i, rec := range recs {
				diff(t, fmt.Sprintf("follower %d vs History", i), hist, rec.waitRev(t, total))
			}
		}},
		namedTest{"FollowThenSnapshotHasNoGap", func(t *testing.T) {
			// The list-then-watch pattern rooms relies on: Follow, then
			// Snapshot at R; the followed batches after R complete it.
			st := s.open(t, Config{})
			const room, writers = "listwatch", 3
			var (
				wg      sync.WaitGroup
				errc    = make(chan error, writers)
				done    = make(chan struct{})
				started = make(chan struct{}, writers)
			)
			for w := range writers {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-done:
							return
						default:
						}
						k := fmt.Sprintf("k%d", (w*7+i)%7)
						wr := store.Put(k, []byte(fmt.Sprint(w, i)))
						if i%3 == 2 {
							wr = store.Delete(k)
						}
						_, err := st.Apply(bg, room, wr)
						if err != nil {
							errc <- err
						}
						if i == 10 || err != nil {
							started <- struct{}{}
						}
						if err != nil {
							return
						}
					}
				})
			}
			stopWriters := sync.OnceFunc(func() { close(done); wg.Wait() })
			t.Cleanup(stopWriters)
			<-started // register while writes are in flight
			rec := follow(t, st, room)
			snap := snapshot(t, st, room, "")
			rec.waitRev(t, snap.Rev+30) // let more writes land after the snapshot
			stopWriters()
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}
			final := snapshot(t, st, room, "")
			got := rec.waitRev(t, final.Rev)
			if got[0].Rev > snap.Rev+1 {
				t.Fatalf("follower registered before a Snapshot at rev %d starts at rev %d, want at most %d", snap.Rev, got[0].Rev, snap.Rev+1)
			}
			diff(t, "followed revisions", span(got[0].Rev, final.Rev), revs(got))
			state := stateOf(snap.Items)
			for _, b := range got {
				if b.Rev > snap.Rev {
					replay(state, []store.Batch{b})
				}
			}
			diff(t, "snapshot + followed batches vs final snapshot", final.Items, items(state, ""))
		}},
		namedTest{"NothingAfterStop", func(t *testing.T) {
			st := s.open(t, Config{})
			rec := follow(t, st, "stop")
			witness := follow(t, st, "stop") // stays registered
			put(t, st, "stop", "k", "1")
			rec.waitRev(t, 1)
			rec.stop()
			put(t, st, "stop", "k", "2")
			put(t, st, "stop", "k", "3")
			witness.waitRev(t, 3)
			diff(t, "revisions followed before stop", []uint64{1}, revs(rec.get()))
			if n := rec.late.Load(); n != 0 {
				t.Errorf("fn was called %d times after stop returned", n)
			}
		}},
		namedTest{"StopWhileWritersRun", func(t *testing.T) {
			st := s.open(t, Config{})
			const room = "stop-race"
			witness := follow(t, st, room)
			var recs []*recorder
			for range 4 {
				recs = append(recs, follow(t, st, room))
			}
			done := make(chan struct{})
			var wg sync.WaitGroup
			errc := make(chan error, 2)
			for w := range 2 {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-done:
							return
						default:
						}
						if _, err := st.Apply(bg, room, store.Put(fmt.Sprint("w", w), []byte(fmt.Sprint(i)))); err != nil {
							errc <- err
							return
						}
					}
				})
			}
			stopWriters := sync.OnceFunc(func() { close(done); wg.Wait() })
			t.Cleanup(stopWriters)
			for i, rec := range recs {
				rec.waitRev(t, uint64(5*(i+1)))
				rec.stop()
			}
			stopWriters()
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}
			last := put(t, st, room, "last", "x")
			witness.waitRev(t, last.Rev)
			for i, rec := range recs {
				if n := rec.late.Load(); n != 0 {
					t.Errorf("follower %d: fn called %d times after stop returned", i, n)
				}
				got := rec.get()
				if len(got) > 0 {
					diff(t, fmt.Sprintf("follower %d revisions", i), span(1, got[len(got)-1].Rev), revs(got))
				}
			}
		}},
	)
}
