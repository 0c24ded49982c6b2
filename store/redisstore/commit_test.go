package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// Tests of the group commit (commit.go): writes queued together go in one
// pipeline, one apply.lua call per room, and each keeps its own outcome.

// applied is the outcome of one Apply.
type applied struct {
	res store.Result
	err error
}

// group applies writes in one round trip: a write to room "hold" goes
// first and is held, before it is sent, until the writes are queued behind
// it; they then go together, in this order, in the next round trip, before
// which before runs (unless nil). It returns their outcomes in order.
func group(t testing.TB, s *Store, before func(), writes ...func() (store.Result, error)) []applied {
	t.Helper()
	gate, held := make(chan struct{}), make(chan struct{})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	defer open() // also when a write is never queued: the test fails rather than hangs
	var trips atomic.Int32
	hook := func() {
		switch trips.Add(1) {
		case 1:
			close(held)
			<-gate
		case 2:
			if before != nil {
				before()
			}
		}
	}
	s.hookGroup.Store(&hook)
	defer s.hookGroup.Store(nil)
	out := make([]applied, len(writes))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := s.Apply(bg, "hold", store.Put("k", nil)); err != nil {
			t.Errorf("the holding write: %v", err)
		}
	}()
	<-held
	for i, w := range writes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].res, out[i].err = w()
		}()
		eventually(t, fmt.Sprint("write ", i, " queued"), 5*time.Second, func() bool { return queued(s) == i+1 })
	}
	open()
	wg.Wait()
	if n := trips.Load(); n != 2 {
		t.Errorf("the writes went in %d round trips, want 1", n-1)
	}
	return out
}

// queued is the number of writes waiting in the store's committers.
func queued(s *Store) int {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	n := 0
	for _, c := range s.committers {
		c.mu.Lock()
		n += len(c.queue)
		c.mu.Unlock()
	}
	return n
}

// put is a write of key = value under conds (key, mod_rev pairs).
func put(s *Store, room, key, value string, conds ...any) func() (store.Result, error) {
	w := store.Put(key, []byte(value))
	for i := 0; i+1 < len(conds); i += 2 {
		w.Conds = append(w.Conds, store.Cond{Key: conds[i].(string), ModRev: uint64(conds[i+1].(int))})
	}
	return func() (store.Result, error) { return s.Apply(bg, room, w) }
}

// calls is the number of calls of cmd Redis has run ("evalsha", "eval"),
// and of those that failed.
func calls(t testing.TB, raw *redis.Client, cmd string) (n, failed int) {
	t.Helper()
	for _, l := range strings.Split(raw.Info(bg, "commandstats").Val(), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "cmdstat_"+cmd+":"); ok {
			for _, f := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(f, "=")
				switch k {
				case "calls":
					n, _ = strconv.Atoi(v)
				case "failed_calls":
					failed, _ = strconv.Atoi(v)
				}
			}
		}
	}
	return n, failed
}

// TestGroupConditions: a group's writes each check their own conditions,
// against the writes before them in the group; one that fails fails
// alone; the group is one round trip of one call per room.
func TestGroupConditions(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	mustApply(t, s, "c", store.Put("k", []byte("0"))) // rev 1
	var before int
	got := group(t, s, func() { before, _ = calls(t, raw, "evalsha") },
		put(s, "c", "k", "1", "k", 1),  // rev 2
		put(s, "c", "k", "x", "k", 1),  // conflict: k is at 2 now
		put(s, "d", "x", "1", "x", 5),  // conflict: x does not exist
		put(s, "c", "j", "1", "j", 0),  // rev 3: j absent
		put(s, "c", "k", "2", "k", 2),  // rev 4: after the first
		put(s, "d", "y", "1"),          // rev 1 of d
		put(s, "c", "j", "x", "j", 0),  // conflict: j exists now
		put(s, "d", "x", "2", "y", 1),  // rev 2 of d
		put(s, "c", "k", "x", "k", 99), // conflict
	)
	wantRev := []uint64{2, 0, 0, 3, 4, 1, 0, 2, 0}
	for i, g := range got {
		var ce *store.ConflictError
		switch {
		case wantRev[i] == 0 && !errors.As(g.err, &ce):
			t.Errorf("write %d: %v, %+v; want a conflict", i, g.err, g.res)
		case wantRev[i] != 0 && (g.err != nil || g.res.Rev != wantRev[i]):
			t.Errorf("write %d: %v, rev %d; want rev %d", i, g.err, g.res.Rev, wantRev[i])
		}
	}
	if ce := (*store.ConflictError)(nil); errors.As(got[1].err, &ce) && (ce.Key != "k" || ce.ModRev != 2) {
		t.Errorf("conflict of write 1: %+v, want k at mod_rev 2", ce)
	}
	if after, _ := calls(t, raw, "evalsha"); after-before != 2 {
		t.Errorf("the group ran %d script calls, want 2 (one per room)", after-before)
	}
	snap := mustSnapshot(t, s, "c")
	if snap.Rev != 4 || len(snap.Items) != 2 || string(snap.Items[1].Value) != "2" || snap.Items[1].Version != 3 {
		t.Errorf("room c after the group: %+v", snap)
	}
	bs := mustHistory(t, s, "d", 1)
	if len(bs) != 2 || bs[1].Events[0].KV.Key != "x" {
		t.Errorf("room d after the group: %s", describe(bs))
	}
}

// TestGroupNoScript: after SCRIPT FLUSH a whole group gets NOSCRIPT, which
// ran nothing: each call is sent again with the script's text, and every
// write applies once.
func TestGroupNoScript(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	mustApply(t, s, "a", store.Put("k", []byte("0")))
	flush := func() {
		raw.ScriptFlush(bg)
		raw.ConfigResetStat(bg)
	}
	got := group(t, s, flush, put(s, "a", "k", "1"), put(s, "b", "k", "1"), put(s, "a", "k", "2"), put(s, "b", "k", "2"))
	for i, want := range []uint64{2, 1, 3, 2} {
		if got[i].err != nil || got[i].res.Rev != want {
			t.Errorf("write %d: %v, rev %d; want rev %d", i, got[i].err, got[i].res.Rev, want)
		}
	}
	if n, failed := calls(t, raw, "evalsha"); n != 2 || failed != 2 {
		t.Errorf("EVALSHA: %d calls, %d failed; want 2 NOSCRIPT (one per room)", n, failed)
	}
	if n, _ := calls(t, raw, "eval"); n != 2 {
		t.Errorf("EVAL: %d calls, want 2", n)
	}
	if res := mustApply(t, s, "a", store.Put("k", []byte("3"))); res.Rev != 4 {
		t.Errorf("next write at rev %d, want 4", res.Rev)
	}
	if n, _ := calls(t, raw, "evalsha"); n != 3 {
		t.Errorf("EVALSHA after the reload: %d calls, want 3 (the script is loaded again)", n)
	}
}

// TestGroupCut: the connection breaks after the reply of the group's first
// call: that write has its result, the others of the group (sent, run,
// reply lost) an unknown outcome, and a write that could not even connect
// is unavailable; once Redis is reachable, writes go on, none applied
// twice.
func TestGroupCut(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	p := startProxy(t, srv.Addr())
	s := openStore(t, "redis://"+p.addr+"/0", func(c *Config) { c.WriteTimeout = 2 * time.Second })
	for _, room := range []string{"r0", "r1", "r2", "r3"} {
		mustApply(t, s, room, store.Put("k", []byte("0"))) // the script is loaded
	}
	got := group(t, s, func() { p.cutAfter(1) }, put(s, "r0", "k", "1"), put(s, "r1", "k", "1"), put(s, "r2", "k", "1"))
	if got[0].err != nil || got[0].res.Rev != 2 {
		t.Errorf("write whose reply arrived: %v, rev %d; want rev 2", got[0].err, got[0].res.Rev)
	}
	for i := 1; i < 3; i++ {
		if err := got[i].err; err == nil || errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrConflict) || !strings.Contains(err.Error(), "outcome unknown") {
			t.Errorf("write %d, reply lost: %v; want an unknown outcome", i, err)
		}
	}
	p.refuse(true) // nothing listens
	if _, err := s.Apply(bg, "r3", store.Put("k", []byte("1"))); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("write with Redis unreachable: %v, want ErrUnavailable", err)
	}
	p.refuse(false)
	for i, room := range []string{"r0", "r1", "r2", "r3"} {
		want := uint64(3)
		if i == 3 {
			want = 2 // its refused write was not applied
		}
		if res := mustApply(t, s, room, store.Put("k", []byte("2"))); res.Rev != want {
			t.Errorf("room %s: next write at rev %d, want %d (each earlier write applied once)", room, res.Rev, want)
		}
	}
}

// TestClusterGroups: writes to rooms on every master of a cluster, from
// many writers at once: one committer per master, each room's revisions
// in order, each write once.
func TestClusterGroups(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s := openStore(t, strings.Join(c.Addrs(), ","), func(cfg *Config) { cfg.Cluster = true })
	const rooms, writers, each = 12, 24, 20
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				room := fmt.Sprint("cg-", (w+i)%rooms)
				if _, err := s.Apply(bg, room, store.Put(fmt.Sprint("w", w), []byte(strconv.Itoa(i)))); err != nil {
					failed.Add(1)
					t.Errorf("%s: %v", room, err)
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		return
	}
	total := uint64(0)
	for r := range rooms {
		room := fmt.Sprint("cg-", r)
		bs := mustHistory(t, s, room, 1)
		checkInOrder(t, bs, bs[0].Epoch, 1, uint64(len(bs)))
		total += uint64(len(bs))
	}
	if total != writers*each {
		t.Errorf("%d revisions in all, want %d: one per write", total, writers*each)
	}
	masters := map[string]bool{}
	for _, a := range c.Addrs() {
		raw := rawRedis(t, a)
		if n, _ := calls(t, raw, "evalsha"); n > 0 {
			masters[a] = true
		}
	}
	s.cmu.Lock()
	n := len(s.committers)
	s.cmu.Unlock()
	if len(masters) != 3 || n != 3 {
		t.Errorf("writes ran on %d masters through %d committers, want 3 and 3", len(masters), n)
	}
}

// TestGroupSessionRecords: the session scripts a connect or a write waits
// for (save, take, detach, key listing) go in the group commit's round
// trips, each a call with its own outcome beside the room writes: many at
// once cost one round trip, not a pooled connection each (a node's pool
// ran out in the scale run's connect burst, and every open past it
// failed). One still queued when its caller gives up is not sent: it is
// unavailable and writes nothing.
func TestGroupSessionRecords(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL()+"?pool_size=1", nil)
	raw := rawRedis(t, srv.Addr())
	rec := func(id string) store.SessionRecord {
		return store.SessionRecord{ID: id, Subject: "u", ResumeHash: []byte("h0"), Lease: "session:" + id, Owner: "n1", Listed: true}
	}
	if err := s.SaveSession(bg, rec("s_old")); err != nil {
		t.Fatal(err)
	}
	var before int
	var took store.SessionRecord
	var took2, detached bool
	var listed store.Listing
	writes := []func() (store.Result, error){put(s, "r", "k", "1")}
	for i := range 20 {
		writes = append(writes, func() (store.Result, error) { return store.Result{}, s.SaveSession(bg, rec(fmt.Sprint("s_", i))) })
	}
	writes = append(writes,
		func() (res store.Result, err error) {
			took, _, took2, err = s.TakeSession(bg, "s_old", "u", []byte("h0"), []byte("h1"), "n2", time.Now())
			return res, err
		},
		func() (res store.Result, err error) {
			detached, err = s.DetachSession(bg, "s_0", 0, time.Hour) // saved earlier in the group
			return res, err
		},
		func() (res store.Result, err error) {
			listed, err = s.ListSessionKey(bg, "s_1", "r", "k")
			return res, err
		},
		put(s, "r", "k", "2"))
	got := group(t, s, func() { before, _ = calls(t, raw, "evalsha") }, writes...)
	for i, g := range got {
		if g.err != nil {
			t.Errorf("call %d of the group: %v", i, g.err)
		}
	}
	if got[0].res.Rev != 1 || got[len(got)-1].res.Rev != 2 {
		t.Errorf("the room writes: revs %d and %d, want 1 and 2", got[0].res.Rev, got[len(got)-1].res.Rev)
	}
	if !took2 || took.Owner != "n2" || took.Gen != 1 || !detached || listed != store.Listed {
		t.Errorf("take %v (%+v), detach %v, listing %v; want each done", took2, took, detached, listed)
	}
	if after, _ := calls(t, raw, "evalsha"); after-before != 24 {
		t.Errorf("the group ran %d script calls, want 24 (one room call, 23 records)", after-before)
	}
	for i := range 20 {
		if _, ok, err := s.Session(bg, fmt.Sprint("s_", i)); !ok || err != nil {
			t.Errorf("session s_%d after the group: %v, %v", i, ok, err)
		}
	}

	// A save queued behind a round trip that outlasts its caller's wait.
	gate, held := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func() { once.Do(func() { close(held); <-gate }) }
	s.hookGroup.Store(&hook)
	defer s.hookGroup.Store(nil)
	done := make(chan error)
	go func() { done <- s.SaveSession(bg, rec("s_hold")) }()
	<-held
	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	defer cancel()
	if err := s.SaveSession(ctx, rec("s_late")); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("a save still queued when its caller gave up: %v, want ErrUnavailable", err)
	}
	close(gate)
	if err := <-done; err != nil {
		t.Errorf("the save held in its round trip: %v", err)
	}
	if _, ok, err := s.Session(bg, "s_late"); ok || err != nil {
		t.Errorf("the save not sent: found %v (%v), want no record", ok, err)
	}
}
