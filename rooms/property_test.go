package rooms_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/statecast/statecast/rooms"
	cel "github.com/statecast/statecast/rooms/filter"
	"github.com/statecast/statecast/store"
	"pgregory.net/rapid"
)

// TestRevisionContractProperty drives an engine with random sequences of
// puts, deletes and transactions, watchers with random prefixes and start
// positions, disconnects and resumes, slow consumers (tiny queues) and
// compaction (tiny history), and checks after every message:
//   - the watcher's view equals the room's state at the message's revision
//     (restricted to its prefixes): snapshot + stream == state;
//   - revisions never go back; data revisions strictly increase;
//   - an events message carries exactly the matching events of its
//     revision, and no matching revision between two messages was skipped
//     (no loss, no duplicate) — only coalesced messages and snapshots may
//     skip revisions, as the contract allows.
//
// A watcher may carry a value filter: its view is then the filter applied
// to the room, and its events exactly the entries and leaves of its keys.
func TestRevisionContractProperty(t *testing.T) {
	checks := 2000
	if testing.Short() {
		checks = 200
	}
	setDefaultFlag("rapid.checks", fmt.Sprint(checks))
	setDefaultFlag("rapid.steps", "100")
	rapid.Check(t, func(rt *rapid.T) {
		m := newModel(rt)
		defer m.close()
		rt.Repeat(map[string]func(*rapid.T){
			"write":      m.write,
			"watch":      m.watch,
			"drain":      m.drain,
			"disconnect": m.disconnect,
			"resume":     m.resume,
			"":           func(*rapid.T) {},
		})
		m.finish(rt)
	})
}

// setDefaultFlag sets a flag unless the command line set it.
func setDefaultFlag(name, value string) {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	if !set {
		flag.Set(name, value)
	}
}

var (
	propKeys     = []string{"a/1", "a/2", "a/b/1", "a/b/2", "b/1", "b/2", "c"}
	propPrefixes = []string{"", "a/", "a/b/", "b/", "c", "zz/"}
	// Exact keys to watch: "a" and "a/" are prefixes of keys, not keys.
	propExact = []string{"a", "a/", "a/1", "a/b/2", "c"}
)

type model struct {
	e      *rooms.Engine
	st     *store.Memory
	epoch  string
	states []map[string]string // state after each revision; states[0] is empty
	events [][]store.Event     // events of each revision
	subs   []*sub
}

type sub struct {
	prefixes []string
	keys     []string       // exact keys, besides prefixes
	f        *valueFilter   // nil: none
	w        *rooms.Watcher // nil while disconnected
	c        *client
}

// valueFilter is a CEL filter over the values (revision numbers here),
// `int(value) % mod == rest`, so keys written at successive revisions
// enter and leave its view, and the model's own reading of it.
type valueFilter struct {
	cel       *cel.Filter
	mod, rest int
}

// filters shares compiled filters between the watchers of one run, as
// the server does, so their evaluation and Changes are shared too.
var filters cel.Cache

func drawFilter(rt *rapid.T) *valueFilter {
	f := &valueFilter{mod: rapid.IntRange(2, 4).Draw(rt, "mod")}
	f.rest = rapid.IntRange(0, f.mod).Draw(rt, "rest") // rest == mod: nothing passes
	var err error
	if f.cel, err = filters.Get(fmt.Sprintf("int(value) %% %d == %d", f.mod, f.rest)); err != nil {
		rt.Fatal(err)
	}
	return f
}

// Match is the model's reading of the filter.
func (f *valueFilter) Match(value string) bool {
	var n int
	fmt.Sscan(value, &n)
	return n%f.mod == f.rest
}

func (f *valueFilter) String() string { return f.cel.String() }

// watchOptions is what s watches, from from.
func (s *sub) watchOptions(from *rooms.Position) rooms.WatchOptions {
	o := rooms.WatchOptions{Prefixes: s.prefixes, Keys: s.keys, From: from}
	if s.f != nil {
		o.Filter = s.f.cel
	}
	return o
}

// selected is the part of state s sees.
func (s *sub) selected(state map[string]string) map[string]string {
	out := filter(state, s.prefixes, s.keys)
	if s.f != nil {
		maps.DeleteFunc(out, func(_, v string) bool { return !s.f.Match(v) })
	}
	return out
}

// expected is what s receives of the events evs of one revision, made on
// before (the state at the revision before).
func (s *sub) expected(evs []store.Event, before map[string]string) []store.Event {
	evs = matching(evs, s.prefixes, s.keys)
	if s.f == nil {
		return evs
	}
	var out []store.Event
	for _, ev := range evs {
		old, had := before[ev.KV.Key]
		switch {
		case ev.Type == store.OpPut && s.f.Match(string(ev.KV.Value)):
			out = append(out, ev)
		case had && s.f.Match(old):
			out = append(out, store.Event{Type: store.OpDelete, KV: store.KV{Key: ev.KV.Key}})
		}
	}
	return out
}

func newModel(rt *rapid.T) *model {
	// An event here costs about store.EventOverhead + 10 bytes: the byte
	// bounds below hold 2 to 8 of them, so byte retention, the node's
	// budget (compacted in the background) and byte-full queues all cut
	// in, alone and together.
	ev := int64(store.EventOverhead + 10)
	ret := store.RetentionPolicy{Default: store.Retention{
		MaxEvents: rapid.SampledFrom([]int{3, 8, 1000}).Draw(rt, "history"),
		MaxBytes:  rapid.SampledFrom([]int64{0, 3 * ev, 8 * ev}).Draw(rt, "historyBytes"),
	}}
	cfg := rooms.Config{
		Retention:        ret,
		HistoryBytes:     rapid.SampledFrom([]int64{0, 2 * ev, 6 * ev}).Draw(rt, "nodeBytes"),
		QueueBytes:       rapid.SampledFrom([]int64{0, 2 * ev}).Draw(rt, "queueBytes"),
		QueueLimit:       rapid.SampledFrom([]int{1, 2, 4, 100}).Draw(rt, "queue"),
		CoalesceLimit:    rapid.SampledFrom([]int{1, 3, 100}).Draw(rt, "coalesce"),
		ReplayChunk:      rapid.SampledFrom([]int{1, 2, 100}).Draw(rt, "chunk"),
		ProgressInterval: -1,
	}
	st := store.NewMemory(store.MemoryConfig{Retention: ret})
	m := &model{e: rooms.New(st, cfg), st: st, states: []map[string]string{{}}, events: [][]store.Event{nil}}
	s, err := m.e.List(context.Background(), "prop", "", rooms.ReadOptions{})
	if err != nil {
		rt.Fatal(err)
	}
	m.epoch = s.Epoch
	return m
}

func (m *model) close() { m.e.Close(); m.st.Close() }

func (m *model) head() uint64 { return uint64(len(m.states) - 1) }

func (m *model) write(rt *rapid.T) {
	n := rapid.IntRange(1, 3).Draw(rt, "ops")
	keys := rapid.SliceOfNDistinct(rapid.SampledFrom(propKeys), n, n, rapid.ID).Draw(rt, "keys")
	var w store.Write
	for _, k := range keys {
		if rapid.IntRange(0, 3).Draw(rt, "del") == 0 {
			w.Ops = append(w.Ops, store.Op{Type: store.OpDelete, Key: k})
		} else {
			w.Ops = append(w.Ops, store.Op{Type: store.OpPut, Key: k, Value: []byte(fmt.Sprint(m.head() + 1))})
		}
	}
	if rapid.IntRange(0, 4).Draw(rt, "cond") == 0 {
		w.Conds = append(w.Conds, store.Cond{Key: keys[0], ModRev: uint64(rapid.IntRange(0, int(m.head())).Draw(rt, "modrev"))})
	}
	res, err := m.e.Apply(context.Background(), "prop", w)
	if err != nil {
		if _, ok := err.(*store.ConflictError); ok {
			return
		}
		rt.Fatal(err)
	}
	if len(res.Events) == 0 {
		if res.Rev != m.head() {
			rt.Fatalf("no-op write at %d, head %d", res.Rev, m.head())
		}
		return
	}
	if res.Rev != m.head()+1 {
		rt.Fatalf("write at %d, want %d", res.Rev, m.head()+1)
	}
	next := maps.Clone(m.states[len(m.states)-1])
	for _, ev := range res.Events {
		if ev.Type == store.OpPut {
			next[ev.KV.Key] = string(ev.KV.Value)
		} else {
			delete(next, ev.KV.Key)
		}
	}
	m.states = append(m.states, next)
	m.events = append(m.events, res.Events)
}

func (m *model) watch(rt *rapid.T) {
	prefixes := rapid.SliceOfN(rapid.SampledFrom(propPrefixes), 0, 2).Draw(rt, "prefixes")
	keys := rapid.SliceOfN(rapid.SampledFrom(propExact), 0, 2).Draw(rt, "exactKeys")
	if len(prefixes) == 0 && len(keys) == 0 {
		prefixes = []string{""} // the whole room, as rooms takes none
	}
	s := &sub{prefixes: prefixes, keys: keys, c: newClient()}
	if rapid.Bool().Draw(rt, "filtered") {
		s.f = drawFilter(rt)
	}
	var from *rooms.Position
	if rapid.Bool().Draw(rt, "resumeFrom") {
		// A client that already has the state at rev-1 from elsewhere.
		rev := uint64(rapid.IntRange(0, int(m.head())+1).Draw(rt, "from"))
		if rev > 0 {
			s.c.epoch, s.c.rev, s.c.data = m.epoch, rev-1, rev-1
			s.c.items = s.selected(m.states[rev-1])
		}
		from = &rooms.Position{Epoch: s.c.epoch, Rev: rev}
	}
	w, err := m.e.Watch(context.Background(), "prop", s.watchOptions(from))
	if err != nil {
		rt.Fatal(err)
	}
	s.w = w
	m.subs = append(m.subs, s)
}

func (m *model) pick(rt *rapid.T, connected bool) *sub {
	var cands []*sub
	for _, s := range m.subs {
		if (s.w != nil) == connected {
			cands = append(cands, s)
		}
	}
	if len(cands) == 0 {
		rt.Skip("no candidate")
	}
	return rapid.SampledFrom(cands).Draw(rt, "sub")
}

func (m *model) drain(rt *rapid.T) {
	m.drainSub(rt, m.pick(rt, true))
}

func (m *model) drainSub(rt *rapid.T, s *sub) {
	msgs, err := s.w.Drain(nil)
	if err != nil {
		rt.Fatal(err)
	}
	for _, msg := range msgs {
		m.check(rt, s, msg)
	}
}

func (m *model) disconnect(rt *rapid.T) {
	s := m.pick(rt, true)
	s.w.Close()
	s.w = nil
}

func (m *model) resume(rt *rapid.T) {
	s := m.pick(rt, false)
	from := s.c.position()
	if s.c.rev == 0 && s.c.epoch == "" {
		from = nil // never got anything: start over
	} else if rapid.IntRange(0, 9).Draw(rt, "wrongEpoch") == 0 {
		from.Epoch = "lost"
	}
	w, err := m.e.Watch(context.Background(), "prop", s.watchOptions(from))
	if err != nil {
		rt.Fatal(err)
	}
	s.w = w
}

// check applies msg to s's view and checks it against the model.
func (m *model) check(rt *rapid.T, s *sub, msg rooms.Message) {
	prev := s.c.rev
	if msg.Rev > m.head() {
		rt.Fatalf("%s at %d beyond head %d", msg.Kind, msg.Rev, m.head())
	}
	if msg.Kind == rooms.KindEvents {
		// No matching revision between the last message and this one.
		for r := prev + 1; r < msg.Rev; r++ {
			if len(s.expected(m.events[r], m.states[r-1])) > 0 {
				rt.Fatalf("watcher %v %v skipped rev %d (from %d to %d)", s.prefixes, s.f, r, prev, msg.Rev)
			}
		}
		want := s.expected(m.events[msg.Rev], m.states[msg.Rev-1])
		if !slices.EqualFunc(want, msg.Change.Events, func(a, b store.Event) bool {
			return a.Type == b.Type && a.KV.Key == b.KV.Key && string(a.KV.Value) == string(b.KV.Value)
		}) {
			rt.Fatalf("rev %d, watcher %v %v: got %v, want %v", msg.Rev, s.prefixes, s.f, msg.Change.Events, want)
		}
		if msg.Change.Filtered != (s.f != nil) {
			rt.Fatalf("rev %d: Filtered %v for filter %v", msg.Rev, msg.Change.Filtered, s.f)
		}
	}
	if msg.Kind == rooms.KindSnapshot && msg.Epoch != m.epoch {
		rt.Fatalf("snapshot epoch %q, want %q", msg.Epoch, m.epoch)
	}
	if msg.Change != nil && msg.Change.Filtered {
		for _, ev := range msg.Change.Events {
			if _, in := s.c.items[ev.KV.Key]; ev.Type == store.OpDelete && !in {
				rt.Fatalf("%s at %d: a leave of %q, not in the view %v", msg.Kind, msg.Rev, ev.KV.Key, s.c.items)
			}
		}
	}
	if err := s.c.apply(msg); err != nil {
		rt.Fatal(err)
	}
	if want := s.selected(m.states[msg.Rev]); !maps.Equal(want, s.c.items) {
		rt.Fatalf("watcher %v %v after %s at %d: view %v, want %v", s.prefixes, s.f, msg.Kind, msg.Rev, s.c.items, want)
	}
}

// finish drains every connected watcher to the end: each must then hold
// the room's current state.
func (m *model) finish(rt *rapid.T) {
	for _, s := range m.subs {
		if s.w == nil {
			continue
		}
		for range 10_000 {
			msgs, err := s.w.Drain(nil)
			if err != nil {
				rt.Fatal(err)
			}
			if len(msgs) == 0 {
				break
			}
			for _, msg := range msgs {
				m.check(rt, s, msg)
			}
		}
		if want := s.selected(m.states[m.head()]); !maps.Equal(want, s.c.items) {
			rt.Fatalf("watcher %v at the end: view %v, want %v", s.prefixes, s.c.items, want)
		}
		s.w.Close()
	}
}

func matchesAny(key string, prefixes, keys []string) bool {
	return slices.Contains(keys, key) || slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(key, p) })
}

func filter(state map[string]string, prefixes, keys []string) map[string]string {
	out := map[string]string{}
	for k, v := range state {
		if matchesAny(k, prefixes, keys) {
			out[k] = v
		}
	}
	return out
}

func matching(evs []store.Event, prefixes, keys []string) []store.Event {
	var out []store.Event
	for _, ev := range evs {
		if matchesAny(ev.KV.Key, prefixes, keys) {
			out = append(out, ev)
		}
	}
	return out
}
