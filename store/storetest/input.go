package storetest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/statecast/statecast/store"
)

// testValues: keys and values round-trip byte-exact; Apply copies values.
func testValues(t *testing.T, s *suite) {
	all256 := make([]byte, 256)
	for i := range all256 {
		all256[i] = byte(i)
	}
	big := make([]byte, 256<<10) // the default MaxValueBytes
	for i := range big {
		big[i] = byte(i * 7)
	}
	cases := []struct {
		name, key string
		value     []byte
	}{
		{"PlainASCII", "plain", []byte("hello")},
		{"EmptyValue", "empty", []byte{}},
		{"NilValueIsEmpty", "nil", nil},
		{"UTF8KeyAndValue", "ключ/日本/🎉", []byte("значение ☃ 値")},
		{"SpacesAndPunctuationInKey", "with space/and\ttab:{x}[y]%20", []byte(" ")},
		{"ControlBytesInKey", "ctl\x01\x1f\x7f", []byte("x")},
		{"AllByteValues", "binary", all256},
		{"InvalidUTF8Value", "not-utf8", []byte{0xff, 0xfe, 0x00, 0xc3}},
		{"NULValue", "nul", []byte{0}},
		{"JSONValue", "json", []byte(`{"a":[1,2,"\u00e9"],"b":null}`)},
		{"KeyAtDefaultLimit", strings.Repeat("k", 1024), []byte("x")},
		{"ValueAtDefaultLimit", "big", big},
	}
	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()
		st := s.open(t, Config{})
		const room = "bytes"
		rec := follow(t, st, room)
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) { // sequential: one room, one follower
				res := apply(t, st, room, store.Put(c.key, c.value))
				check := func(where string, got store.KV) {
					t.Helper()
					if got.Key != c.key || !bytes.Equal(got.Value, c.value) {
						t.Errorf("%s returned key %.40q with a %d-byte value %.40q, want key %.40q with the %d-byte value %.40q",
							where, got.Key, len(got.Value), got.Value, c.key, len(c.value), c.value)
					}
				}
				check("Apply", res.Events[0].KV)
				snap := snapshot(t, st, room, c.key)
				if len(snap.Items) == 0 {
					t.Fatal("Snapshot(prefix=key) is empty")
				}
				check("Snapshot", snap.Items[0])
				check("History", history(t, st, room, res.Rev, 0)[0].Events[0].KV)
				bs := rec.waitRev(t, res.Rev)
				check("Follow", bs[len(bs)-1].Events[0].KV)
			})
		}
	})
	t.Run("ApplyCopiesValues", func(t *testing.T) {
		t.Parallel()
		st := s.open(t, Config{})
		const room = "copies"
		rec := follow(t, st, room)
		buf := []byte("original")
		apply(t, st, room, store.Put("single", buf))
		copy(buf, "MUTATED!")
		shared := []byte("aaaabbbb") // two ops sharing one backing array
		apply(t, st, room, txn(
			store.Op{Type: store.OpPut, Key: "t1", Value: shared[:4]},
			store.Op{Type: store.OpPut, Key: "t2", Value: shared[4:]},
		))
		copy(shared, "XXXXYYYY")
		wantItems := []store.KV{kv("single", "original", 1, 1, 1), kv("t1", "aaaa", 2, 2, 1), kv("t2", "bbbb", 2, 2, 1)}
		diff(t, "Snapshot after mutating the caller's buffers", wantItems, snapshot(t, st, room, "").Items)
		state := map[string]store.KV{}
		replay(state, history(t, st, room, 1, 0))
		diff(t, "History after mutating the caller's buffers", wantItems, items(state, ""))
		state = map[string]store.KV{}
		replay(state, rec.waitRev(t, 2))
		diff(t, "followed batches after mutating the caller's buffers", wantItems, items(state, ""))
	})
}

// testBadInput: every rejected write returns a typed error and writes
// nothing; reads of an invalid room return ErrInvalidRoom.
func testBadInput(t *testing.T, s *suite) {
	limits := store.Limits{MaxKeyBytes: 16, MaxValueBytes: 32, MaxOps: 4}
	invalidRooms := []struct{ name, room string }{
		{"Empty", ""},
		{"TooLong", strings.Repeat("r", 129)},
		{"Slash", "a/b"},
		{"HashTagBraces", "{x}"},
		{"Space", "with space"},
		{"NonASCII", "zimmer-ü"},
		{"NUL", "a\x00b"},
	}
	okPut := opPut("ok", "fine")
	const room = "bad"
	type badWrite struct {
		name  string
		room  string
		write store.Write
		want  error
	}
	cases := []badWrite{
		{"EmptyKey", room, store.Put("", []byte("v")), store.ErrInvalidKey},
		{"EmptyKeyInDelete", room, store.Delete(""), store.ErrInvalidKey},
		{"KeyOverMaxKeyBytes", room, store.Put(strings.Repeat("k", 17), nil), store.ErrInvalidKey},
		{"KeyLimitCountsBytesNotRunes", room, store.Put(strings.Repeat("é", 8)+"a", nil), store.ErrInvalidKey},
		{"KeyInvalidUTF8", room, store.Put("bad\xff", nil), store.ErrInvalidKey},
		{"KeyWithNUL", room, store.Put("a\x00b", nil), store.ErrInvalidKey},
		{"ConditionWithInvalidKey", room, store.Write{Conds: []store.Cond{{Key: ""}}, Ops: []store.Op{okPut}}, store.ErrInvalidKey},
		{"ValueOverMaxValueBytes", room, store.Put("k", bytes.Repeat([]byte("v"), 33)), store.ErrValueTooLarge},
		{"ValidOpThenOversizedValue", room, txn(okPut, store.Op{Type: store.OpPut, Key: "k2", Value: make([]byte, 33)}), store.ErrValueTooLarge},
		{"ConditionOnAnotherRoom", room, store.Write{Conds: []store.Cond{{Room: "other", Key: "k"}}, Ops: []store.Op{okPut}}, store.ErrCrossRoom},
		{"TooManyOps", room, txn(opPut("1", ""), opPut("2", ""), opPut("3", ""), opPut("4", ""), opPut("5", "")), store.ErrTooManyOps},
		{"DuplicateKeyPutPut", room, txn(opPut("d", "1"), okPut, opPut("d", "2")), store.ErrDuplicateKey},
		{"DuplicateKeyPutDelete", room, txn(opPut("d", "1"), opDel("d")), store.ErrDuplicateKey},
		{"UnknownOpTypeZero", room, txn(okPut, store.Op{Key: "z"}), store.ErrInvalidOp},
		{"UnknownOpType99", room, txn(store.Op{Type: 99, Key: "z"}), store.ErrInvalidOp},
		{"KeepLeaseAndALease", room, txn(store.Op{Type: store.OpPut, Key: "k", Value: []byte("1"), Lease: "L", KeepLease: true}), store.ErrInvalidOp},
		{"KeepValueAndAValue", room, txn(store.Op{Type: store.OpPut, Key: "k", Value: []byte("1"), KeepValue: true}), store.ErrInvalidOp},
		{"DeleteThatKeeps", room, txn(store.Op{Type: store.OpDelete, Key: "k", KeepLease: true}), store.ErrInvalidOp},
		{"EmptyWrite", room, store.Write{}, store.ErrEmptyWrite},
		{"EmptyWriteWithEmptySlices", room, store.Write{Ops: []store.Op{}, Conds: []store.Cond{}}, store.ErrEmptyWrite},
	}
	for _, r := range invalidRooms {
		cases = append(cases, badWrite{"InvalidRoom" + r.name, r.room, store.Write{Ops: []store.Op{okPut}}, store.ErrInvalidRoom})
	}
	t.Run("RejectedWritesWriteNothing", func(t *testing.T) {
		t.Parallel()
		st := s.open(t, Config{Limits: limits})
		put(t, st, room, "k", "v")
		rec := follow(t, st, room)
		before := snapshot(t, st, room, "")
		beforeHist := history(t, st, room, 1, 0)
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				res, err := st.Apply(bg, c.room, c.write)
				wantErrIs(t, fmt.Sprintf("Apply(%q, %+v)", c.room, c.write), err, c.want)
				if err == nil {
					t.Errorf("Apply succeeded with %+v", res)
				}
				checkUnchanged(t, st, room, before, beforeHist)
			})
		}
		// No rejected write reached the follower: the next batch is rev 2.
		put(t, st, room, "after", "x")
		diff(t, "revisions followed", []uint64{2}, revs(rec.waitRev(t, 2)))
		// Nor did any of them create a room.
		if h := head(t, st, "other"); h != 0 {
			t.Errorf("room %q named only in a cross-room condition is at rev %d, want 0", "other", h)
		}
	})
	t.Run("LimitsAreInclusive", func(t *testing.T) {
		t.Parallel()
		st := s.open(t, Config{Limits: limits})
		longRoom := strings.Repeat("r", 128)
		for i, w := range []store.Write{
			store.Put(strings.Repeat("k", 16), nil),
			store.Put(strings.Repeat("é", 8), nil),
			store.Put("v", make([]byte, 32)),
			txn(opPut("1", ""), opPut("2", ""), opPut("3", ""), opPut("4", "")),
			{Conds: []store.Cond{{Room: longRoom, Key: "1", ModRev: 4}}, Ops: []store.Op{opDel("1")}},
		} {
			res, err := st.Apply(bg, longRoom, w)
			if err != nil {
				t.Fatalf("Apply(%+v) at the limits: %v", w, err)
			}
			if res.Rev != uint64(i+1) {
				t.Errorf("Apply(%+v) committed at rev %d, want %d", w, res.Rev, i+1)
			}
		}
	})
	t.Run("ReadsOfInvalidRoom", func(t *testing.T) {
		t.Parallel()
		st := s.open(t, Config{})
		for _, r := range invalidRooms {
			_, err := st.Snapshot(bg, r.room, "")
			wantErrIs(t, fmt.Sprintf("Snapshot(%q)", r.room), err, store.ErrInvalidRoom)
			_, err = st.History(bg, r.room, 1, 0)
			wantErrIs(t, fmt.Sprintf("History(%q)", r.room), err, store.ErrInvalidRoom)
			stop, err := st.Follow(r.room, func(store.Batch) {})
			wantErrIs(t, fmt.Sprintf("Follow(%q)", r.room), err, store.ErrInvalidRoom)
			if err == nil && stop != nil {
				stop()
			}
		}
	})
}

// testContext: an already-cancelled context fails the call and writes
// nothing.
func testContext(t *testing.T, s *suite) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	parallel(t,
		namedTest{"CancelledApplyWritesNothing", func(t *testing.T) {
			st := s.open(t, Config{})
			put(t, st, "ctx", "k", "v")
			rec := follow(t, st, "ctx")
			before := snapshot(t, st, "ctx", "")
			beforeHist := history(t, st, "ctx", 1, 0)
			for _, w := range []store.Write{
				store.Put("k", []byte("new")),
				store.Put("other", []byte("new")),
				store.Delete("k"),
				txn(opPut("a", "1"), opDel("k")),
			} {
				_, err := st.Apply(cancelled, "ctx", w)
				wantErrIs(t, fmt.Sprintf("Apply(cancelled, %+v)", w), err, context.Canceled)
			}
			checkUnchanged(t, st, "ctx", before, beforeHist)
			_, err := st.Apply(cancelled, "ctx-fresh", store.Put("k", nil))
			wantErrIs(t, "Apply(cancelled) to a never-written room", err, context.Canceled)
			if h := head(t, st, "ctx-fresh"); h != 0 {
				t.Errorf("never-written room at rev %d after a cancelled Apply, want 0", h)
			}
			put(t, st, "ctx", "after", "x")
			diff(t, "revisions followed", []uint64{2}, revs(rec.waitRev(t, 2)))
		}},
		namedTest{"CancelledReadsFailWithContextError", func(t *testing.T) {
			// A read may ignore an already-cancelled context (it changes
			// nothing), but if it fails it must say why.
			st := s.open(t, Config{})
			put(t, st, "ctx", "k", "v")
			for _, room := range []string{"ctx", "ctx-fresh"} {
				if _, err := st.Snapshot(cancelled, room, ""); err != nil {
					wantErrIs(t, fmt.Sprintf("Snapshot(cancelled, %q)", room), err, context.Canceled)
				}
				if _, err := st.History(cancelled, room, 1, 0); err != nil {
					wantErrIs(t, fmt.Sprintf("History(cancelled, %q)", room), err, context.Canceled)
				}
			}
		}},
	)
}
