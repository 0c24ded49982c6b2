package storetest

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/statecast/statecast/store"
)

// testDifferential runs random writes against the store and against a
// plain map model, and compares revisions, events, conflicts, snapshots,
// retention and history replay.
func testDifferential(t *testing.T, s *suite) {
	for _, seed := range []uint64{1, 2, 3, 42} {
		t.Run(fmt.Sprint("Seed", seed), func(t *testing.T) {
			t.Parallel()
			runDifferential(t, s, seed)
		})
	}
}

const (
	diffWrites    = 300
	diffMaxEvents = 40 // small, so that compaction happens along the way
)

var diffKeys = []string{"k0", "k1", "k2", "k3", "k4", "k5"}

func runDifferential(t *testing.T, s *suite, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	st := s.open(t, Config{Retention: store.RetentionPolicy{Default: store.Retention{MaxEvents: diffMaxEvents}}})
	const room = "diff"
	rec := follow(t, st, room)
	m := newModel(snapshot(t, st, room, "").Epoch, diffMaxEvents)
	results := map[uint64]store.Result{}

	for step := range diffWrites {
		w := randomWrite(rng, m)
		want, wantErr := m.apply(w)
		got, err := st.Apply(bg, room, w)
		switch {
		case wantErr != nil:
			var ce *store.ConflictError
			if !errors.As(err, &ce) || !errors.Is(err, store.ErrConflict) {
				t.Fatalf("step %d: Apply(%+v) = %v, want conflict %v", step, w, err, wantErr)
			}
			if ce.Epoch == "" {
				t.Fatalf("step %d: ConflictError %+v names no epoch", step, *ce)
			}
			wantErr.Epoch = ce.Epoch
			if diff(t, fmt.Sprintf("step %d: ConflictError of %+v", step, w), *wantErr, *ce) {
				t.FailNow()
			}
		case err != nil:
			t.Fatalf("step %d: Apply(%+v): %v, want success", step, w, err)
		default:
			if diff(t, fmt.Sprintf("step %d: Result of %+v", step, w), want, got) {
				t.FailNow()
			}
			if len(got.Events) > 0 {
				results[got.Rev] = got
			}
		}
		if step%25 == 0 {
			m.check(t, st, room)
		}
	}
	m.check(t, st, room)
	if t.Failed() {
		return
	}

	oldest := m.oldest()
	if oldest > 1 {
		_, err := st.History(bg, room, oldest-1, 0)
		wantCompacted(t, err, oldest)
	}
	for range 10 {
		// History from a random retained revision, replayed onto the state
		// just before it, gives the current state.
		from := oldest + rng.Uint64N(m.rev+2-oldest) // oldest .. head+1
		bs := history(t, st, room, from, 0)
		if diff(t, fmt.Sprintf("History(%d) revisions", from), span(from, m.rev), revs(bs)) {
			continue
		}
		for _, b := range bs {
			diff(t, fmt.Sprintf("History batch %d vs its Apply result", b.Rev), results[b.Rev], asResult(b))
		}
		state := maps.Clone(m.states[from-1])
		replay(state, bs)
		diff(t, fmt.Sprintf("state at %d + History(%d) vs current state", from-1, from), items(m.kv, ""), items(state, ""))

		limit := rng.IntN(8) - 1
		diff(t, fmt.Sprintf("History(%d, limit=%d)", from, limit), limitBatches(bs, limit), history(t, st, room, from, limit))
	}

	followed := rec.waitRev(t, m.rev)
	if !diff(t, "followed revisions", span(1, m.rev), revs(followed)) {
		for _, b := range followed {
			diff(t, fmt.Sprintf("followed batch %d vs its Apply result", b.Rev), results[b.Rev], asResult(b))
		}
	}
}

// limitBatches is what History(limit) returns from bs: whole batches up to
// limit events, at least one.
func limitBatches(bs []store.Batch, limit int) []store.Batch {
	if limit <= 0 {
		return bs
	}
	n := 0
	for i, b := range bs {
		if i > 0 && n+len(b.Events) > limit {
			return bs[:i]
		}
		n += len(b.Events)
	}
	return bs
}

// randomWrite picks a put, a delete or a transaction with conditions on
// the small key space, biased so that most conditions hold.
func randomWrite(rng *rand.Rand, m *model) store.Write {
	key := func() string { return diffKeys[rng.IntN(len(diffKeys))] }
	value := func() []byte {
		v := make([]byte, rng.IntN(7))
		for i := range v {
			v[i] = byte(rng.Uint32())
		}
		return v
	}
	switch n := rng.IntN(10); {
	case n < 4:
		return store.Put(key(), value())
	case n < 6:
		return store.Delete(key())
	default:
		var w store.Write
		for _, i := range rng.Perm(len(diffKeys))[:rng.IntN(4)] {
			if rng.IntN(3) > 0 {
				w.Ops = append(w.Ops, store.Op{Type: store.OpPut, Key: diffKeys[i], Value: value()})
			} else {
				w.Ops = append(w.Ops, store.Op{Type: store.OpDelete, Key: diffKeys[i]})
			}
		}
		nconds := rng.IntN(3)
		if len(w.Ops) == 0 && nconds == 0 {
			nconds = 1
		}
		for range nconds {
			k := key()
			var modRev uint64
			switch rng.IntN(5) {
			case 0, 1, 2:
				modRev = m.kv[k].ModRev // holds
			case 3:
				modRev = 0 // holds when k is missing
			default:
				modRev = rng.Uint64N(m.rev + 2) // usually stale or in the future
			}
			w.Conds = append(w.Conds, store.Cond{Key: k, ModRev: modRev})
		}
		return w
	}
}

// model is the reference implementation: a map and a counter.
type model struct {
	epoch     string
	maxEvents int
	rev       uint64
	kv        map[string]store.KV
	states    []map[string]store.KV // states[r] is the state at revision r
	retained  []int                 // events of each retained batch, oldest first
}

func newModel(epoch string, maxEvents int) *model {
	return &model{
		epoch:     epoch,
		maxEvents: maxEvents,
		kv:        map[string]store.KV{},
		states:    []map[string]store.KV{{}},
	}
}

// oldest is the oldest revision History can replay.
func (m *model) oldest() uint64 { return m.rev + 1 - uint64(len(m.retained)) }

// apply is what the store should do with w.
func (m *model) apply(w store.Write) (store.Result, *store.ConflictError) {
	for _, c := range w.Conds {
		if cur := m.kv[c.Key].ModRev; cur != c.ModRev {
			return store.Result{}, &store.ConflictError{Key: c.Key, ModRev: cur, Rev: m.rev}
		}
	}
	rev := m.rev + 1
	next := maps.Clone(m.kv)
	var events []store.Event
	for _, op := range w.Ops {
		cur, exists := m.kv[op.Key]
		var prev *store.KV
		if exists {
			prev = &cur
		}
		switch op.Type {
		case store.OpPut:
			kv := store.KV{Key: op.Key, Value: op.Value, CreateRev: rev, ModRev: rev, Version: 1}
			if exists {
				kv.CreateRev, kv.Version = cur.CreateRev, cur.Version+1
			}
			next[op.Key] = kv
			events = append(events, store.Event{Type: store.OpPut, KV: kv, Prev: prev})
		case store.OpDelete:
			if exists {
				delete(next, op.Key)
				events = append(events, store.Event{Type: store.OpDelete, KV: store.KV{Key: op.Key, ModRev: rev}, Prev: prev})
			}
		}
	}
	if len(events) == 0 {
		return store.Result{Epoch: m.epoch, Rev: m.rev}, nil
	}
	m.rev, m.kv = rev, next
	m.states = append(m.states, next)
	m.retained = append(m.retained, len(events))
	total := 0
	for _, n := range m.retained {
		total += n
	}
	for total > m.maxEvents {
		total -= m.retained[0]
		m.retained = m.retained[1:]
	}
	return store.Result{Epoch: m.epoch, Rev: rev, Events: events}, nil
}

// check compares the store's snapshot of room with the model.
func (m *model) check(t *testing.T, st store.Store, room string) {
	t.Helper()
	want := store.Snapshot{Epoch: m.epoch, Rev: m.rev, Oldest: m.oldest(), Items: items(m.kv, "")}
	if diff(t, fmt.Sprintf("Snapshot at model rev %d", m.rev), want, snapshot(t, st, room, "")) {
		t.FailNow()
	}
	want.Items = items(m.kv, "k3")
	diff(t, "Snapshot(prefix k3)", want, snapshot(t, st, room, "k3"))
}
