package rooms

// Benchmarks for the fan-out cost of docs/DESIGN.md#fan-out-cost:
//
//	BenchmarkReplay            replay of one prefix out of 100,000 retained events, against a
//	                           bare prefix-test loop over the same events (target <= 2x, < 0.28 ms)
//	BenchmarkMatch             prefix index vs scan of all watchers (target <= 2.1 µs and >= 50x at 100k)
//	BenchmarkFanout            Apply + fan-out + encode of one event to N watchers (encodes/op == 1)
//	BenchmarkIdleWatcherMemory heap bytes per idle live watcher (target < 1 KiB)
//	BenchmarkExactKeyWrite     a write to a key watched exactly, among 10 vs 10,000 watchers of
//	                           other exact keys (target: flat, ratio <= 1.5)
//
// Run: go test ./rooms -run '^$' -bench . -benchmem -count 3
// CI smoke: go test -race ./rooms -run '^$' -bench . -benchtime 1x

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/store"
)

const benchRoomName = "bench"

// newBenchEngine returns an Engine on a fresh memory store, both closed
// when the benchmark ends. Rooms stay loaded for the whole benchmark and
// no progress marks are sent, so the measured work is deterministic.
func newBenchEngine(tb testing.TB, cfg Config, ret store.RetentionPolicy) *Engine {
	tb.Helper()
	st := store.NewMemory(store.MemoryConfig{Retention: ret})
	cfg.Retention = ret
	cfg.IdleTimeout = time.Hour
	cfg.ProgressInterval = -1
	e := New(st, cfg)
	tb.Cleanup(func() {
		_ = e.Close()
		_ = st.Close()
	})
	return e
}

// loadBenchRoom loads (or returns) the benchmark room of e.
func loadBenchRoom(tb testing.TB, e *Engine) *room {
	tb.Helper()
	r, err := e.acquire(context.Background(), benchRoomName)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// injectPuts commits one single-key put per key to r through the room's
// store tail callback (onBatch), exactly as a store's Follow delivers a
// commit: view update, history push and notify all run for real.
//
// The memory store is bypassed only because filling it is quadratic:
// Retention.Trim sums every retained batch on each Apply, so 100,000
// Applies with MaxEvents = 100,000 take ~11 s (and minutes under -race).
func injectPuts(tb testing.TB, r *room, keys []string, val []byte) {
	tb.Helper()
	r.mu.Lock()
	epoch, head := r.epoch, r.head
	r.mu.Unlock()
	now := time.Now()
	cur := make(map[string]store.KV, len(keys))
	for i, k := range keys {
		rev := head + uint64(i) + 1
		kv := store.KV{Key: k, Value: val, CreateRev: rev, ModRev: rev, Version: 1}
		var prev *store.KV
		if p, ok := cur[k]; ok {
			prev = &p
			kv.CreateRev, kv.Version = p.CreateRev, p.Version+1
		}
		cur[k] = kv
		r.onBatch(store.Batch{Epoch: epoch, Rev: rev, Time: now,
			Events: []store.Event{{Type: store.OpPut, KV: kv, Prev: prev}}})
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.head != head+uint64(len(keys)) {
		tb.Fatalf("inject: room closed=%v head=%d, want %d", r.closed, r.head, head+uint64(len(keys)))
	}
}

// ---------------------------------------------------------------------------
// 1. Replay

const (
	replayEvents = 100_000
	replayGroups = 100 // a group prefix matches ~1% of the events
	replayKeys   = 1000
)

// replayFixture is a loaded room holding replayEvents retained events on
// keys g00/k0000..g99/k0999, written to random groups.
type replayFixture struct {
	e      *Engine
	r      *room
	prefix string
	from   uint64 // oldest retained revision
	want   int    // events under prefix
	segs   [2][]slot
}

func replayKeyList() []string {
	rng := rand.New(rand.NewPCG(1, 2))
	seq := make([]int, replayGroups)
	keys := make([]string, replayEvents)
	for i := range keys {
		g := rng.IntN(replayGroups)
		keys[i] = fmt.Sprintf("g%02d/k%04d", g, seq[g]%replayKeys)
		seq[g]++
	}
	return keys
}

func newReplayFixture(b *testing.B, keys []string, chunk int) *replayFixture {
	ret := store.RetentionPolicy{Default: store.Retention{MaxEvents: replayEvents}}
	e := newBenchEngine(b, Config{ReplayChunk: chunk}, ret)
	r := loadBenchRoom(b, e)
	injectPuts(b, r, keys, []byte(`{"v":1}`))
	f := &replayFixture{e: e, r: r, prefix: "g42/"}
	for _, k := range keys {
		if strings.HasPrefix(k, f.prefix) {
			f.want++
		}
	}
	r.mu.Lock()
	if r.hist.n != replayEvents {
		b.Fatalf("history holds %d events, want %d", r.hist.n, replayEvents)
	}
	f.from = r.hist.oldest
	// The room gets no more writes, so the ring's slots stay as they are.
	f.segs[0], f.segs[1] = r.hist.segments(0)
	r.mu.Unlock()
	return f
}

// replay watches f.prefix from the oldest retained revision and drains
// until the synced marker. The caller closes the returned watcher.
func (f *replayFixture) replay(b *testing.B, dst []Message) ([]Message, *Watcher) {
	w, err := f.e.Watch(context.Background(), benchRoomName,
		WatchOptions{Prefixes: []string{f.prefix}, From: &Position{Rev: f.from}})
	if err != nil {
		b.Fatal(err)
	}
	dst = dst[:0]
	for {
		n := len(dst)
		if dst, err = w.Drain(dst); err != nil {
			b.Fatal(err)
		}
		if len(dst) == n {
			b.Fatal("replay: Drain returned nothing before the synced marker")
		}
		if dst[len(dst)-1].Kind == KindSynced {
			break
		}
	}
	if len(dst) != f.want+1 { // one message per matching revision, then synced
		b.Fatalf("replay: %d messages, want %d", len(dst), f.want+1)
	}
	return dst, w
}

// floor is the bare lower bound of a replay: the prefix test on every
// retained event, over the ring's own slots.
func (f *replayFixture) floor() int {
	n := 0
	for _, seg := range f.segs {
		for i := range seg {
			if strings.HasPrefix(seg[i].key, f.prefix) {
				n++
			}
		}
	}
	return n
}

func BenchmarkReplay(b *testing.B) {
	keys := replayKeyList()
	big := newReplayFixture(b, keys, 1<<20)
	def := newReplayFixture(b, keys, 0)

	runReplay := func(f *replayFixture) func(*testing.B) {
		return func(b *testing.B) {
			dst := make([]Message, 0, 2*f.want+2)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var w *Watcher
				dst, w = f.replay(b, dst)
				b.StopTimer()
				w.Close()
				b.StartTimer()
			}
		}
	}
	b.Run("chunk=1M", runReplay(big))
	b.Run("chunk=default", runReplay(def))

	b.Run("floor", func(b *testing.B) {
		n := 0
		for i := 0; i < b.N; i++ {
			n += big.floor()
		}
		if n != b.N*big.want {
			b.Fatalf("floor counted %d, want %d", n, b.N*big.want)
		}
	})

	// Replay (chunk=1M) and floor interleaved in the same iterations, so
	// their ratio is immune to drift between sub-benchmarks.
	b.Run("vs_floor", func(b *testing.B) {
		dst := make([]Message, 0, 2*big.want+2)
		var tr, tf time.Duration
		n := 0
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			var w *Watcher
			dst, w = big.replay(b, dst)
			t1 := time.Now()
			b.StopTimer()
			w.Close()
			b.StartTimer()
			t2 := time.Now()
			n += big.floor()
			t3 := time.Now()
			tr += t1.Sub(t0)
			tf += t3.Sub(t2)
		}
		b.StopTimer()
		if n != b.N*big.want {
			b.Fatalf("floor counted %d, want %d", n, b.N*big.want)
		}
		b.ReportMetric(float64(tr.Nanoseconds())/float64(b.N), "replay-ns/op")
		b.ReportMetric(float64(tf.Nanoseconds())/float64(b.N), "floor-ns/op")
		b.ReportMetric(float64(tr)/float64(tf), "replay/floor")
	})
}

// ---------------------------------------------------------------------------
// 2. Matching

// matchFixture is n watchers with distinct prefixes, both in an index and
// in a plain list for the scan.
type matchFixture struct {
	idx  *index
	all  []benchScanEntry
	keys []string // 1024 keys, each matching one random watcher
}

type benchScanEntry struct {
	prefix string
	w      *Watcher
}

func newMatchFixture(n int) *matchFixture {
	f := &matchFixture{idx: newIndex(), all: make([]benchScanEntry, n)}
	for i := range f.all {
		p := fmt.Sprintf("/w/%06d/", i)
		w := &Watcher{prefixes: []string{p}, pos: make([]int32, 1)}
		f.all[i] = benchScanEntry{p, w}
		f.idx.add(w, 0)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	f.keys = make([]string, 1024)
	for i := range f.keys {
		f.keys[i] = fmt.Sprintf("/w/%06d/x", rng.IntN(n))
	}
	return f
}

func (f *matchFixture) scan(key string, fn func(*Watcher)) {
	for i := range f.all {
		if strings.HasPrefix(key, f.all[i].prefix) {
			fn(f.all[i].w)
		}
	}
}

func BenchmarkMatch(b *testing.B) {
	sizes := []struct {
		name string
		n    int
	}{{"1k", 1_000}, {"10k", 10_000}, {"100k", 100_000}}
	fx := make([]*matchFixture, len(sizes))
	for i, s := range sizes {
		fx[i] = newMatchFixture(s.n)
	}
	checkHits := func(b *testing.B, hits, want int) {
		if hits != want {
			b.Fatalf("%d matches, want %d", hits, want)
		}
	}

	b.Run("index", func(b *testing.B) {
		for i, s := range sizes {
			f := fx[i]
			b.Run("watchers="+s.name, func(b *testing.B) {
				hits := 0
				fn := func(*Watcher) { hits++ }
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					f.idx.match(f.keys[i%len(f.keys)], fn)
				}
				checkHits(b, hits, b.N)
			})
		}
	})
	b.Run("scan", func(b *testing.B) {
		for i, s := range sizes {
			f := fx[i]
			b.Run("watchers="+s.name, func(b *testing.B) {
				hits := 0
				fn := func(*Watcher) { hits++ }
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					f.scan(f.keys[i%len(f.keys)], fn)
				}
				checkHits(b, hits, b.N)
			})
		}
	})
	// Both interleaved in the same iterations: one scanned event and all
	// 1024 keys through the index per iteration.
	b.Run("ratio", func(b *testing.B) {
		for i, s := range sizes {
			f := fx[i]
			b.Run("watchers="+s.name, func(b *testing.B) {
				hits := 0
				fn := func(*Watcher) { hits++ }
				var ti, ts time.Duration
				for i := 0; i < b.N; i++ {
					t0 := time.Now()
					for _, k := range f.keys {
						f.idx.match(k, fn)
					}
					t1 := time.Now()
					f.scan(f.keys[i%len(f.keys)], fn)
					t2 := time.Now()
					ti += t1.Sub(t0)
					ts += t2.Sub(t1)
				}
				checkHits(b, hits, b.N*(len(f.keys)+1))
				idxNs := float64(ti.Nanoseconds()) / float64(b.N*len(f.keys))
				scanNs := float64(ts.Nanoseconds()) / float64(b.N)
				b.ReportMetric(idxNs, "index-ns/event")
				b.ReportMetric(scanNs, "scan-ns/event")
				b.ReportMetric(scanNs/idxNs, "scan/index")
			})
		}
	})
}

// ---------------------------------------------------------------------------
// 3. Write path

type benchWireEvent struct {
	Type      string          `json:"type"`
	Key       string          `json:"key"`
	Value     json.RawMessage `json:"value,omitempty"`
	CreateRev uint64          `json:"create_rev,omitempty"`
	ModRev    uint64          `json:"mod_rev"`
	Version   uint64          `json:"version,omitempty"`
}

type benchWireChange struct {
	Rev    uint64           `json:"rev"`
	Events []benchWireEvent `json:"events"`
}

func benchEncodeJSON(c *Change) []byte {
	m := benchWireChange{Rev: c.Rev, Events: make([]benchWireEvent, len(c.Events))}
	for i, ev := range c.Events {
		we := benchWireEvent{Type: "put", Key: ev.KV.Key, Value: ev.KV.Value,
			CreateRev: ev.KV.CreateRev, ModRev: ev.KV.ModRev, Version: ev.KV.Version}
		if ev.Type == store.OpDelete {
			we.Type, we.Value = "delete", nil
		}
		m.Events[i] = we
	}
	buf, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return buf
}

func BenchmarkFanout(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) { benchFanout(b, n) })
	}
}

func benchFanout(b *testing.B, n int) {
	// A short history: the memory store's Apply sums every retained batch
	// (Retention.Trim), which would otherwise dominate the write path.
	ret := store.RetentionPolicy{Default: store.Retention{MaxEvents: 128}}
	e := newBenchEngine(b, Config{}, ret)
	ctx := context.Background()
	r := loadBenchRoom(b, e)
	r.mu.Lock()
	head := r.head
	r.mu.Unlock()

	ws := make([]*Watcher, n)
	dst := make([]Message, 0, 8)
	for i := range ws {
		w, err := e.Watch(ctx, benchRoomName, WatchOptions{From: &Position{Rev: head + 1}})
		if err != nil {
			b.Fatal(err)
		}
		if dst, err = w.Drain(dst[:0]); err != nil || len(dst) != 1 || dst[0].Kind != KindSynced {
			b.Fatalf("watcher %d: %v %+v, want one synced marker", i, err, dst)
		}
		ws[i] = w
	}
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("obj/%02d", i)
	}
	val := []byte(`{"x":12,"y":34,"name":"player"}`)
	encodes, sent := 0, 0
	encode := func(c *Change) []byte {
		encodes++
		return benchEncodeJSON(c)
	}

	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := e.Apply(ctx, benchRoomName, store.Put(keys[i%len(keys)], val))
		if err != nil {
			b.Fatal(err)
		}
		for _, w := range ws {
			if dst, err = w.Drain(dst[:0]); err != nil {
				b.Fatal(err)
			}
			if len(dst) != 1 || dst[0].Kind != KindEvents || dst[0].Rev != res.Rev {
				b.Fatalf("got %d messages (%+v), want the event at %d", len(dst), dst, res.Rev)
			}
			sent += len(dst[0].Change.Encoded(0, encode))
		}
	}
	b.StopTimer()
	if encodes != b.N || sent == 0 {
		b.Fatalf("%d encodes for %d events (%d bytes sent)", encodes, b.N, sent)
	}
	b.ReportMetric(float64(encodes)/float64(b.N), "encodes/op")
	for _, w := range ws {
		w.Close()
	}
}

// ---------------------------------------------------------------------------
// 4. Memory

func BenchmarkIdleWatcherMemory(b *testing.B) {
	// shared: every watcher on the whole room; distinct: one prefix each
	// (per-user subscriptions), which also grows the index.
	b.Run("prefix=shared", func(b *testing.B) { benchIdleWatcherMemory(b, false) })
	b.Run("prefix=distinct", func(b *testing.B) { benchIdleWatcherMemory(b, true) })
}

func benchIdleWatcherMemory(b *testing.B, distinct bool) {
	const n = 10_000
	ctx := context.Background()
	prefixes := make([][]string, n) // the caller's input, not engine memory
	for i := range prefixes {
		if distinct {
			prefixes[i] = []string{fmt.Sprintf("u/%05d/", i)}
		}
	}
	ws := make([]*Watcher, n)
	dst := make([]Message, 0, 4)
	var perWatcher float64
	for it := 0; it < b.N; it++ {
		// A fresh room each time: maps do not shrink after Close, so a
		// reused room would hide the cost of the next watchers.
		b.StopTimer()
		e := newBenchEngine(b, Config{}, store.RetentionPolicy{})
		for i := 0; i < 3; i++ {
			if _, err := e.Apply(ctx, benchRoomName, store.Put(fmt.Sprintf("k%d", i), []byte("v"))); err != nil {
				b.Fatal(err)
			}
		}
		r := loadBenchRoom(b, e)
		r.mu.Lock()
		head := r.head
		r.mu.Unlock()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.StartTimer()

		for i := range ws {
			w, err := e.Watch(ctx, benchRoomName, WatchOptions{Prefixes: prefixes[i], From: &Position{Rev: head + 1}})
			if err != nil {
				b.Fatal(err)
			}
			if dst, err = w.Drain(dst[:0]); err != nil || len(dst) != 1 || dst[0].Kind != KindSynced {
				b.Fatalf("watcher %d: %v %+v, want one synced marker", i, err, dst)
			}
			ws[i] = w
		}

		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(ws)
		runtime.KeepAlive(r)
		perWatcher += float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
		r.mu.Lock()
		if len(r.watchers) != n {
			b.Fatalf("room has %d watchers, want %d", len(r.watchers), n)
		}
		r.mu.Unlock()
		// Engine.Close ends every watcher at once; closing 10,000 watchers
		// of one prefix one by one is quadratic (index.remove scans the
		// prefix's watcher list).
		_ = e.Close()
		clear(ws)
		b.StartTimer()
	}
	b.ReportMetric(perWatcher/float64(b.N), "B/watcher")
}

// BenchmarkUnwatchManyPrefixes measures adding and removing one watcher
// of P distinct prefixes, next to 100 other watchers of the same
// prefixes. ns/prefix must stay flat as P grows: removal was once
// quadratic in P (80,000 prefixes took 8 s of CPU to unsubscribe).
func BenchmarkUnwatchManyPrefixes(b *testing.B) {
	for _, p := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("prefixes=%d", p), func(b *testing.B) {
			ps := make([]string, p)
			for i := range ps {
				ps[i] = fmt.Sprintf("k%07d/", i)
			}
			ps = normalizePrefixes(ps, nil)
			x := newIndex()
			for range 100 {
				w := &Watcher{prefixes: ps, pos: make([]int32, len(ps))}
				for k := range ps {
					x.add(w, k)
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				w := &Watcher{prefixes: ps, pos: make([]int32, len(ps))}
				for k := range ps {
					x.add(w, k)
				}
				for k := range ps {
					x.remove(w, k)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*p), "ns/prefix")
		})
	}
}

// BenchmarkExactKeyWrite: a write to games/7, watched by one exact-key
// watcher, in a room whose other watchers (10, or 10,000) each watch one
// other exact key (games/8, games/9, games/10, …, many of them starting
// with games/7, all lengths from 7 to 11 bytes). The index finds a key's
// exact watchers with one lookup, so the write costs the same in both
// rooms: the two run interleaved in the same iterations, and ratio is
// the 10,000 room's time per write over the 10 room's.
func BenchmarkExactKeyWrite(b *testing.B) {
	type fixture struct {
		r     *room
		w     *Watcher
		epoch string
		rev   uint64
	}
	ctx := context.Background()
	setup := func(others int) *fixture {
		e := newBenchEngine(b, Config{}, store.RetentionPolicy{Default: store.Retention{MaxEvents: 1000}})
		r := loadBenchRoom(b, e)
		for i := range others {
			key := fmt.Sprintf("games/%d", i+8)
			if _, err := e.Watch(ctx, benchRoomName, WatchOptions{Keys: []string{key}, From: &Position{Rev: 1}}); err != nil {
				b.Fatal(err)
			}
		}
		w, err := e.Watch(ctx, benchRoomName, WatchOptions{Keys: []string{"games/7"}, From: &Position{Rev: 1}})
		if err != nil {
			b.Fatal(err)
		}
		r.mu.Lock()
		f := &fixture{r: r, w: w, epoch: r.epoch, rev: r.head}
		r.mu.Unlock()
		return f
	}
	val := []byte(`{"players":3}`)
	now := time.Now()
	var buf []Message
	write := func(f *fixture) {
		f.rev++
		kv := store.KV{Key: "games/7", Value: val, CreateRev: 1, ModRev: f.rev, Version: f.rev}
		f.r.onBatch(store.Batch{Epoch: f.epoch, Rev: f.rev, Time: now, Events: []store.Event{{Type: store.OpPut, KV: kv}}})
		var err error
		if buf, err = f.w.Drain(buf[:0]); err != nil || len(buf) == 0 {
			b.Fatalf("the watcher of games/7 got %d messages, %v", len(buf), err)
		}
	}
	few, many := setup(10), setup(10_000)
	b.ReportAllocs()
	var tFew, tMany time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		write(few)
		t1 := time.Now()
		write(many)
		tFew += t1.Sub(t0)
		tMany += time.Since(t1)
	}
	b.ReportMetric(float64(tFew.Nanoseconds())/float64(b.N), "ns/write-10")
	b.ReportMetric(float64(tMany.Nanoseconds())/float64(b.N), "ns/write-10k")
	b.ReportMetric(float64(tMany)/float64(tFew), "ratio")
}
