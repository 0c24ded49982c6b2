package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/statecast/statecast/store"
)

// testRestart: a durable store keeps epoch, state, revisions and history
// across Close and reopen; an ephemeral one comes back empty with a new
// epoch.
func testRestart(t *testing.T, s *suite) {
	// Little retention, so that compaction state crosses the restart too.
	cfg := Config{Retention: store.RetentionPolicy{Default: store.Retention{MaxEvents: 6}}}
	binary := []byte{0, 1, 2, 0xff, 0xfe, '\n', 0}
	// populate writes 9 revisions to "r1" (10 events, 6 retained) and 1 to
	// "r2".
	populate := func(t *testing.T, st store.Store) {
		put(t, st, "r1", "a", "1")
		put(t, st, "r1", "b", "2")
		apply(t, st, "r1", txn(opPut("c", "3"), opDel("a"), opPut("d", "4")))
		put(t, st, "r1", "b", "2'")
		del(t, st, "r1", "b")
		apply(t, st, "r1", store.Put("empty", []byte{}))
		apply(t, st, "r1", store.Put("bin", binary))
		put(t, st, "r1", "ключ/🎉", "значение")
		put(t, st, "r1", "d", "4'")
		put(t, st, "r2", "x", "y")
	}
	rooms := []string{"r1", "r2", "never-written"}
	type roomState struct {
		snap store.Snapshot
		hist []store.Batch
	}
	capture := func(t *testing.T, st store.Store) map[string]roomState {
		m := map[string]roomState{}
		for _, room := range rooms {
			snap := snapshot(t, st, room, "")
			m[room] = roomState{snap, history(t, st, room, snap.Oldest, 0)}
		}
		return m
	}
	closeStore := func(t *testing.T, st store.Store) {
		t.Helper()
		if err := st.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}

	if !s.f.Durable {
		t.Run("ReopenedStoreIsEmptyWithNewEpoch", func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			st := s.openDir(t, dir, cfg)
			populate(t, st)
			old := snapshot(t, st, "r1", "")
			closeStore(t, st)

			st = s.openDir(t, dir, cfg)
			snap := snapshot(t, st, "r1", "")
			if snap.Epoch == "" || snap.Epoch == old.Epoch {
				t.Errorf("epoch after reopen = %q, want a new non-empty epoch (was %q)", snap.Epoch, old.Epoch)
			}
			diff(t, "Snapshot after reopen", store.Snapshot{Epoch: snap.Epoch, Rev: 0, Oldest: 1}, snap)
			diff(t, "History(1) after reopen", []store.Batch(nil), history(t, st, "r1", 1, 0))
			res := put(t, st, "r1", "a", "new")
			diff(t, "first write after reopen", store.Result{Epoch: snap.Epoch, Rev: 1, Events: []store.Event{
				{Type: store.OpPut, KV: kv("a", "new", 1, 1, 1)},
			}}, res)
		})
		return
	}

	parallel(t,
		namedTest{"KeepsEpochStateAndHistory", func(t *testing.T) {
			dir := t.TempDir()
			st := s.openDir(t, dir, cfg)
			populate(t, st)
			before := capture(t, st)
			if before["r1"].snap.Oldest != 4 { // revs 4..9 are the last 6 events
				t.Fatalf("r1 Oldest before restart = %d, want 4", before["r1"].snap.Oldest)
			}
			closeStore(t, st)

			st = s.openDir(t, dir, cfg)
			after := capture(t, st)
			for _, room := range rooms {
				diff(t, fmt.Sprintf("room %q: Snapshot after reopen", room), before[room].snap, after[room].snap)
				diff(t, fmt.Sprintf("room %q: History after reopen", room), before[room].hist, after[room].hist)
			}
			checkOldest(t, st, "r1", 4)
			bin := snapshot(t, st, "r1", "bin").Items
			if len(bin) != 1 || string(bin[0].Value) != string(binary) {
				t.Errorf("binary value after reopen = %v, want %v", bin, binary)
			}
		}},
		namedTest{"WritesContinueAtNextRevision", func(t *testing.T) {
			dir := t.TempDir()
			st := s.openDir(t, dir, cfg)
			populate(t, st)
			before := snapshot(t, st, "r1", "")
			closeStore(t, st)

			for restart := 1; restart <= 2; restart++ {
				st = s.openDir(t, dir, cfg)
				rec := follow(t, st, "r1")
				prev := snapshot(t, st, "r1", "d").Items[0]
				res := put(t, st, "r1", "d", fmt.Sprint("after restart ", restart))
				want := store.Result{Epoch: before.Epoch, Rev: before.Rev + uint64(restart), Events: []store.Event{{
					Type: store.OpPut,
					KV:   store.KV{Key: "d", Value: res.Events[0].KV.Value, CreateRev: prev.CreateRev, ModRev: before.Rev + uint64(restart), Version: prev.Version + 1},
					Prev: &prev,
				}}}
				diff(t, fmt.Sprintf("write after restart %d", restart), want, res)
				diff(t, "followed after restart", []store.Result{want}, resultsOf(rec.waitRev(t, res.Rev)))
				diff(t, "History after restart", []store.Result{want}, resultsOf(history(t, st, "r1", res.Rev, 0)))
				rec.stop()
				closeStore(t, st)
			}
			st = s.openDir(t, dir, cfg)
			if h := head(t, st, "r1"); h != before.Rev+2 {
				t.Errorf("head after two restarts = %d, want %d", h, before.Rev+2)
			}
		}},
	)
}

// testClose: calls after Close return ErrClosed; calls racing Close
// either succeed or return ErrClosed, and no acknowledged write is lost.
func testClose(t *testing.T, s *suite) {
	parallel(t,
		namedTest{"CallsAfterCloseReturnErrClosed", func(t *testing.T) {
			st := s.open(t, Config{})
			put(t, st, "closing", "k", "v")
			stop, err := st.Follow("closing", func(store.Batch) {})
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Close(); err != nil {
				t.Fatalf("first Close: %v", err)
			}
			_, err = st.Apply(bg, "closing", store.Put("k", []byte("x")))
			wantErrIs(t, "Apply after Close", err, store.ErrClosed)
			_, err = st.Apply(bg, "fresh", store.Put("k", []byte("x")))
			wantErrIs(t, "Apply to a new room after Close", err, store.ErrClosed)
			_, err = st.Snapshot(bg, "closing", "")
			wantErrIs(t, "Snapshot after Close", err, store.ErrClosed)
			_, err = st.History(bg, "closing", 1, 0)
			wantErrIs(t, "History after Close", err, store.ErrClosed)
			_, err = st.Follow("closing", func(store.Batch) {})
			wantErrIs(t, "Follow after Close", err, store.ErrClosed)
			stop() // stopping a follower of a closed store is harmless
			wantErrIs(t, "second Close", st.Close(), store.ErrClosed)
		}},
		namedTest{"CloseWhileWriting", func(t *testing.T) {
			dir := t.TempDir()
			st := s.openDir(t, dir, Config{})
			const room, writers = "racing", 3
			var (
				wg    sync.WaitGroup
				mu    sync.Mutex
				acked []store.Result
				errc  = make(chan error, writers)
				ready = make(chan struct{}, writers)
			)
			for w := range writers {
				wg.Go(func() {
					signalled := false
					defer func() {
						if !signalled {
							ready <- struct{}{}
						}
					}()
					for i := 0; ; i++ {
						res, err := st.Apply(bg, room, store.Put(fmt.Sprint("w", w), []byte(fmt.Sprint(i))))
						if errors.Is(err, store.ErrClosed) {
							return
						}
						if err != nil {
							errc <- fmt.Errorf("apply racing Close: got %v, want success or ErrClosed", err)
							return
						}
						mu.Lock()
						acked = append(acked, res)
						mu.Unlock()
						if i == 10 {
							signalled = true
							ready <- struct{}{}
						}
					}
				})
			}
			for range writers {
				<-ready
			}
			if err := st.Close(); err != nil {
				t.Fatalf("Close while writing: %v", err)
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Error(err)
			}
			if !s.f.Durable {
				return
			}
			// Every acknowledged write survives the restart.
			st = s.openDir(t, dir, Config{})
			snap := snapshot(t, st, room, "")
			hist := history(t, st, room, 1, 0)
			for _, res := range acked {
				if res.Rev > snap.Rev || res.Rev > uint64(len(hist)) {
					t.Errorf("acknowledged rev %d is missing after reopen (head %d)", res.Rev, snap.Rev)
					continue
				}
				diff(t, fmt.Sprintf("acknowledged rev %d after reopen", res.Rev), res, asResult(hist[res.Rev-1]))
			}
		}},
	)
}
