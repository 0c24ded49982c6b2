package storetest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/statecast/statecast/store"
)

// wantQuota fails unless err is a *store.QuotaError reporting the room's
// size as the refused write would have made it.
func wantQuota(t testing.TB, what string, err error, keys, bytes int64) {
	t.Helper()
	var qe *store.QuotaError
	if !errors.As(err, &qe) || !errors.Is(err, store.ErrQuotaExceeded) {
		t.Fatalf("%s: got %v, want a *store.QuotaError", what, err)
	}
	if qe.Keys != keys || qe.Bytes != bytes {
		t.Errorf("%s: QuotaError reports %d keys, %d bytes; want %d, %d", what, qe.Keys, qe.Bytes, keys, bytes)
	}
}

// refused applies w, which must be refused over the quota with nothing
// written.
func refused(t testing.TB, st store.Store, room string, w store.Write, keys, bytes int64) {
	t.Helper()
	before := snapshot(t, st, room, "")
	hist := history(t, st, room, before.Oldest, 0)
	_, err := st.Apply(bg, room, w)
	wantQuota(t, fmt.Sprintf("Apply(%+v)", w.Ops), err, keys, bytes)
	checkUnchanged(t, st, room, before, hist)
}

// testQuota: a room holds at most Limits.MaxRoomKeys keys and
// Limits.MaxRoomBytes bytes of keys and values. The check runs in the same
// atomic step as the commit; a write that does not grow what is over
// always commits, so a full room can be emptied.
func testQuota(t *testing.T, s *suite) {
	parallel(t,
		namedTest{"Keys", func(t *testing.T) {
			st := s.open(t, Config{Limits: store.Limits{MaxRoomKeys: 3}})
			const room = "quota-keys"
			put(t, st, room, "a", "1")
			apply(t, st, room, txn(opPut("b", "2"), opPut("c", "3")))
			refused(t, st, room, store.Put("d", []byte("4")), 4, 8)
			// A transaction is charged whole: one key too many refuses it all.
			refused(t, st, room, txn(opDel("a"), opPut("d", "4"), opPut("e", "5")), 4, 8)
			put(t, st, room, "a", "overwritten") // same keys: commits
			del(t, st, room, "b")
			put(t, st, room, "d", "4")
			apply(t, st, room, txn(opDel("d"), opPut("e", "5"))) // as many keys as before
			refused(t, st, room, store.Put("f", []byte("6")), 4, 18)
			// Another room has a quota of its own.
			put(t, st, "quota-keys-other", "f", "6")
		}},
		namedTest{"Bytes", func(t *testing.T) {
			st := s.open(t, Config{Limits: store.Limits{MaxRoomBytes: 100}})
			const room = "quota-bytes"
			v40 := strings.Repeat("x", 40)
			put(t, st, room, "k1", v40)               // 42
			apply(t, st, room, txn(opPut("k2", v40))) // 84
			refused(t, st, room, store.Put("k3", []byte(v40[:20])), 3, 106)
			put(t, st, room, "k3", v40[:14]) // exactly 100
			refused(t, st, room, store.Put("k3", []byte(v40[:15])), 3, 101)
			put(t, st, room, "k1", "")                      // 60: a smaller value
			put(t, st, room, "k4", strings.Repeat("y", 38)) // 100
			// Deleting a missing key, a failed condition: nothing counted.
			apply(t, st, room, store.Delete("missing"))
			_, err := st.Apply(bg, room, store.Write{Conds: []store.Cond{{Key: "k1", ModRev: 999}}, Ops: []store.Op{opDel("k4")}})
			if !errors.Is(err, store.ErrConflict) {
				t.Fatalf("conditional delete: got %v, want a conflict", err)
			}
			refused(t, st, room, store.Put("z", nil), 5, 101)
			del(t, st, room, "k2")
			put(t, st, room, "z", v40)
		}},
		namedTest{"LeaseNotCounted", func(t *testing.T) {
			st := s.open(t, Config{Limits: store.Limits{MaxRoomBytes: 10}})
			const room = "quota-lease"
			apply(t, st, room, txn(store.Op{Type: store.OpPut, Key: "k", Value: []byte("123456789"), Lease: strings.Repeat("l", 64)}))
			refused(t, st, room, store.Put("j", nil), 2, 11)
		}},
		namedTest{"ConcurrentWritesCannotOvershoot", func(t *testing.T) {
			const max, writers = 10, 40
			st := s.open(t, Config{Limits: store.Limits{MaxRoomKeys: max}})
			const room = "quota-race"
			var wg sync.WaitGroup
			var mu sync.Mutex
			ok, over := 0, 0
			for i := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := st.Apply(bg, room, store.Put(fmt.Sprintf("k%02d", i), []byte("v")))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						ok++
					case errors.Is(err, store.ErrQuotaExceeded):
						over++
					default:
						t.Errorf("Apply: %v", err)
					}
				}()
			}
			wg.Wait()
			if ok != max || over != writers-max {
				t.Errorf("%d writes committed and %d refused, want %d and %d", ok, over, max, writers-max)
			}
			if n := len(snapshot(t, st, room, "").Items); n != max {
				t.Errorf("room holds %d keys, want %d", n, max)
			}
		}},
		namedTest{"DeletesEmptyARoomOverItsQuota", func(t *testing.T) {
			if !s.f.Durable {
				t.Skip("lowering the quota of a room needs a store that reopens with its state")
			}
			dir := t.TempDir()
			st := s.openDir(t, dir, Config{})
			const room = "quota-lowered"
			apply(t, st, room, txn(opPut("a", "1"), opPut("b", "2"), opPut("c", "3")))
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			st = s.openDir(t, dir, Config{Limits: store.Limits{MaxRoomKeys: 1, MaxRoomBytes: 2}})
			refused(t, st, room, store.Put("d", nil), 4, 7)
			refused(t, st, room, store.Put("a", []byte("11")), 3, 7)
			put(t, st, room, "a", "") // shrinks bytes, keeps keys
			apply(t, st, room, txn(opDel("a"), opDel("b")))
			refused(t, st, room, txn(opDel("c"), opPut("d", "44")), 1, 3)
			apply(t, st, room, txn(opDel("c"), opPut("d", "4")))
		}},
	)
}
