// Package storetest is the conformance suite every store.Store backend
// runs: each line of the revision contract
// (docs/DESIGN.md#the-revision-contract) and of the store.Store doc
// comments is a named subtest.
//
// A backend hooks it up from its own tests:
//
//	func TestMemoryConformance(t *testing.T) {
//		storetest.Run(t, storetest.Factory{
//			Open: func(t testing.TB, dir string, cfg storetest.Config) store.Store { ... },
//		})
//	}
//
// The suite opens a fresh store per subtest (in its own t.TempDir), so
// subtests run in parallel. It closes every store it opens in t.Cleanup and
// tolerates store.ErrClosed there, so tests may Close stores themselves.
package storetest

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/statecast/statecast/store"
)

// Config is what a subtest asks of the store it opens. The zero value of
// each field means the backend's default (store.Limits and
// store.RetentionPolicy document theirs; a nil Clock means time.Now).
type Config struct {
	Limits    store.Limits
	Retention store.RetentionPolicy
	Clock     func() time.Time
}

// Factory opens the backend under test.
type Factory struct {
	// Open opens a store on dir (a directory the suite creates with
	// t.TempDir and reuses to test reopen).
	Open func(t testing.TB, dir string, cfg Config) store.Store
	// Durable: reopening the same dir keeps epoch, state, revisions and
	// history (file store); otherwise a reopened store is empty with a new
	// epoch (memory).
	Durable bool
}

// Run runs the conformance suite against the stores f opens.
func Run(t *testing.T, f Factory) {
	if f.Open == nil {
		t.Fatal("storetest: Factory.Open is nil")
	}
	s := &suite{f: f}
	groups := []struct {
		name string
		run  func(*testing.T, *suite)
	}{
		{"Revision", testRevision},
		{"KeyRevisions", testKeyRevisions},
		{"Conditions", testConditions},
		{"Snapshot", testSnapshot},
		{"History", testHistory},
		{"Retention", testRetention},
		{"Follow", testFollow},
		{"Values", testValues},
		{"BadInput", testBadInput},
		{"Context", testContext},
		{"Restart", testRestart},
		{"Close", testClose},
		{"Differential", testDifferential},
		{"Leases", testLeases},
		{"Sessions", testSessions},
		{"SharedLeases", testSharedLeases},
		{"Wids", testWids},
		{"Quota", testQuota},
		{"Backup", testBackup},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			g.run(t, s)
		})
	}
}

// suite carries the factory through the subtests.
type suite struct{ f Factory }

// open opens a store on a fresh directory and closes it when t ends.
func (s *suite) open(t testing.TB, cfg Config) store.Store {
	t.Helper()
	return s.openDir(t, t.TempDir(), cfg)
}

// openDir opens a store on dir and closes it when t ends, unless the test
// closed it already.
func (s *suite) openDir(t testing.TB, dir string, cfg Config) store.Store {
	t.Helper()
	st := s.f.Open(t, dir, cfg)
	if st == nil {
		t.Fatal("Factory.Open returned a nil store")
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil && !errors.Is(err, store.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return st
}

// parallel runs each named case as a parallel subtest.
func parallel(t *testing.T, cases ...namedTest) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t)
		})
	}
}

type namedTest struct {
	name string
	fn   func(t *testing.T)
}

// cmpOpts is used for every comparison. A store may hand back an empty
// value as nil or as []byte{} (both are the empty value), and may keep a
// batch's commit time at millisecond precision.
var cmpOpts = cmp.Options{
	cmpopts.EquateEmpty(),
	cmpopts.EquateApproxTime(time.Millisecond),
}

// diff reports want and got as "(-want +got)" when they differ.
func diff(t testing.TB, what string, want, got any) bool {
	t.Helper()
	if reflect.DeepEqual(want, got) {
		return false // fast path: cmp is slow under -race
	}
	if d := cmp.Diff(want, got, cmpOpts); d != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", what, d)
		return true
	}
	return false
}

var bg = context.Background()

// apply commits w and fails the test on error.
func apply(t testing.TB, st store.Store, room string, w store.Write) store.Result {
	t.Helper()
	res, err := st.Apply(bg, room, w)
	if err != nil {
		t.Fatalf("Apply(%q, %+v): %v", room, w, err)
	}
	return res
}

func put(t testing.TB, st store.Store, room, key, value string) store.Result {
	t.Helper()
	return apply(t, st, room, store.Put(key, []byte(value)))
}

func del(t testing.TB, st store.Store, room, key string) store.Result {
	t.Helper()
	return apply(t, st, room, store.Delete(key))
}

// txn builds a Write from ops.
func txn(ops ...store.Op) store.Write { return store.Write{Ops: ops} }

func opPut(key, value string) store.Op {
	return store.Op{Type: store.OpPut, Key: key, Value: []byte(value)}
}

func opDel(key string) store.Op { return store.Op{Type: store.OpDelete, Key: key} }

func snapshot(t testing.TB, st store.Store, room, prefix string) store.Snapshot {
	t.Helper()
	snap, err := st.Snapshot(bg, room, prefix)
	if err != nil {
		t.Fatalf("Snapshot(%q, %q): %v", room, prefix, err)
	}
	return snap
}

func history(t testing.TB, st store.Store, room string, from uint64, limit int) []store.Batch {
	t.Helper()
	bs, err := st.History(bg, room, from, limit)
	if err != nil {
		t.Fatalf("History(%q, from=%d, limit=%d): %v", room, from, limit, err)
	}
	return bs
}

// head is the room's current revision.
func head(t testing.TB, st store.Store, room string) uint64 {
	t.Helper()
	return snapshot(t, st, room, "").Rev
}

// revs lists the revisions of bs.
func revs(bs []store.Batch) []uint64 {
	out := make([]uint64, len(bs))
	for i, b := range bs {
		out[i] = b.Rev
	}
	return out
}

// span returns the revisions from..to inclusive.
func span(from, to uint64) []uint64 {
	var out []uint64
	for r := from; r <= to; r++ {
		out = append(out, r)
	}
	return out
}

// kv builds an expected KV.
func kv(key, value string, createRev, modRev, version uint64) store.KV {
	return store.KV{Key: key, Value: []byte(value), CreateRev: createRev, ModRev: modRev, Version: version}
}

// asResult is what Apply should have returned for batch b.
func asResult(b store.Batch) store.Result {
	return store.Result{Epoch: b.Epoch, Rev: b.Rev, Events: b.Events}
}

// replay applies the events of bs to state (key -> KV).
func replay(state map[string]store.KV, bs []store.Batch) {
	for _, b := range bs {
		for _, ev := range b.Events {
			switch ev.Type {
			case store.OpPut:
				state[ev.KV.Key] = ev.KV
			case store.OpDelete:
				delete(state, ev.KV.Key)
			}
		}
	}
}

// items returns the KVs of state under prefix, sorted by key, as Snapshot
// reports them.
func items(state map[string]store.KV, prefix string) []store.KV {
	var out []store.KV
	for k, v := range state {
		if strings.HasPrefix(k, prefix) {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// stateOf turns snapshot items back into a map.
func stateOf(kvs []store.KV) map[string]store.KV {
	m := make(map[string]store.KV, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv
	}
	return m
}

// wantErrIs fails unless errors.Is(err, target).
func wantErrIs(t testing.TB, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: got error %v, want errors.Is(err, %v)", what, err, target)
	}
}

// wantConflict checks that err is a *ConflictError on key whose current
// mod_rev is modRev, checked when the room was at head.
func wantConflict(t testing.TB, err error, key string, modRev, head uint64) {
	t.Helper()
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("got error %v, want errors.Is(err, store.ErrConflict)", err)
	}
	var ce *store.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("got error %T %v, want a *store.ConflictError", err, err)
	}
	if ce.Epoch == "" {
		t.Errorf("ConflictError %+v names no epoch", *ce)
	}
	diff(t, "ConflictError", store.ConflictError{Key: key, ModRev: modRev, Rev: head, Epoch: ce.Epoch}, *ce)
}

// wantCompacted checks that err is a *CompactedError naming oldest.
func wantCompacted(t testing.TB, err error, oldest uint64) {
	t.Helper()
	if !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("got error %v, want errors.Is(err, store.ErrCompacted)", err)
	}
	var ce *store.CompactedError
	if !errors.As(err, &ce) {
		t.Fatalf("got error %T %v, want a *store.CompactedError", err, err)
	}
	if ce.Oldest != oldest {
		t.Errorf("CompactedError.Oldest = %d, want %d", ce.Oldest, oldest)
	}
}

// checkOldest checks that the room's Snapshot.Oldest is want and that
// History agrees: History(want-1) is compacted (naming want) and
// History(want) starts at want (or is empty when want is head+1).
func checkOldest(t testing.TB, st store.Store, room string, want uint64) {
	t.Helper()
	snap := snapshot(t, st, room, "")
	if snap.Oldest != want {
		t.Errorf("room %q: Snapshot.Oldest = %d, want %d", room, snap.Oldest, want)
	}
	if want > 1 {
		_, err := st.History(bg, room, want-1, 0)
		wantCompacted(t, err, want)
	}
	bs := history(t, st, room, want, 0)
	diff(t, "History(Oldest) revisions", span(want, snap.Rev), revs(bs))
}

// checkUnchanged fails if room differs from before: same epoch, revision,
// oldest revision, items and history.
func checkUnchanged(t testing.TB, st store.Store, room string, before store.Snapshot, beforeHist []store.Batch) {
	t.Helper()
	diff(t, "Snapshot after a rejected write", before, snapshot(t, st, room, ""))
	diff(t, "History after a rejected write", beforeHist, history(t, st, room, before.Oldest, 0))
}

// recorder collects what a Follow callback receives.
type recorder struct {
	mu      sync.Mutex
	batches []store.Batch
	notify  chan struct{} // capacity 1: "something arrived"

	stopFn  func()
	once    sync.Once
	stopped atomic.Bool  // set once stop has returned
	late    atomic.Int64 // calls that arrived after stop returned
}

// follow registers a recorder on room; it is stopped when t ends.
func follow(t testing.TB, st store.Store, room string) *recorder {
	t.Helper()
	r := &recorder{notify: make(chan struct{}, 1)}
	stop, err := st.Follow(room, r.add)
	if err != nil {
		t.Fatalf("Follow(%q): %v", room, err)
	}
	r.stopFn = stop
	t.Cleanup(r.stop)
	return r
}

func (r *recorder) add(b store.Batch) {
	if r.stopped.Load() {
		r.late.Add(1)
	}
	r.mu.Lock()
	r.batches = append(r.batches, b)
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// stop unregisters the callback; later calls count as late.
func (r *recorder) stop() {
	r.once.Do(func() {
		r.stopFn()
		r.stopped.Store(true)
	})
}

func (r *recorder) get() []store.Batch {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches)
}

// waitRev waits until a batch at rev or later has arrived and returns all
// batches received so far. Backends may deliver to followers just after
// Apply returns, so the suite waits (up to a generous deadline) instead of
// assuming delivery happened inside Apply.
func (r *recorder) waitRev(t testing.TB, rev uint64) []store.Batch {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		bs := r.get()
		if len(bs) > 0 && bs[len(bs)-1].Rev >= rev {
			return bs
		}
		select {
		case <-r.notify:
		case <-deadline.C:
			t.Fatalf("Follow: no batch at revision %d after 10s; received revisions %v", rev, revs(bs))
		}
	}
}

// fakeClock is a settable time source for age retention.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
