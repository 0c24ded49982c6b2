package rooms

// Benchmarks of filtered watches, the room's side of the lobby scenario
// of cmd/statecast's BenchmarkFilteredLobby (issue 17): 50,000 games, 10
// distinct CEL filters each selecting about 10 % of them.
//
//	BenchmarkFilteredSnapshot  a new filtered watcher's snapshot (1,000 of them over 10 filters)
//	BenchmarkFilteredNotify    one write's fan-out to 1,000 watchers over 10 filters
//
// Run: go test ./rooms -run '^$' -bench Filtered -benchmem

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/statecast/statecast/rooms/filter"
	"github.com/statecast/statecast/store"
)

var (
	benchModes   = [...]string{"duel", "team", "ffa", "ranked", "coop"}
	benchRegions = [...]string{"eu", "us"}
)

// benchGame is a random game's value; filter f of benchLobbyFilters
// selects about 9 % of them.
func benchGame(rng *rand.Rand) []byte {
	return fmt.Appendf(nil, `{"mode":%q,"region":%q,"players":%d,"max":10}`,
		benchModes[rng.IntN(len(benchModes))], benchRegions[rng.IntN(len(benchRegions))], rng.IntN(11))
}

// benchLobbyFilters compiles the 10 filters: mode × region, open games.
func benchLobbyFilters(b *testing.B) []*filter.Filter {
	var fs []*filter.Filter
	for _, m := range benchModes {
		for _, r := range benchRegions {
			f, err := filter.Compile(fmt.Sprintf(`value.mode == %q && value.region == %q && value.players < value.max`, m, r))
			if err != nil {
				b.Fatal(err)
			}
			fs = append(fs, f)
		}
	}
	return fs
}

// benchLobby is a room of n random games, games/00000 on.
func benchLobby(b *testing.B, n int) (*Engine, *rand.Rand) {
	ret := store.RetentionPolicy{Default: store.Retention{MaxEvents: 128}}
	e := newBenchEngine(b, Config{}, ret)
	rng := rand.New(rand.NewPCG(17, 1))
	for lo := 0; lo < n; lo += 250 {
		var w store.Write
		for i := lo; i < min(n, lo+250); i++ {
			w.Ops = append(w.Ops, store.Op{Type: store.OpPut, Key: fmt.Sprintf("games/%05d", i), Value: benchGame(rng)})
		}
		if _, err := e.Apply(context.Background(), benchRoomName, w); err != nil {
			b.Fatal(err)
		}
	}
	return e, rng
}

func benchLobbyGames() int {
	if testing.Short() {
		return 5000
	}
	return 50_000
}

// BenchmarkFilteredSnapshot: each op is a new watcher of games/ with one
// of the 10 filters (in turn) taking its snapshot, as subscribers
// connecting to the lobby do; they stay until the end.
func BenchmarkFilteredSnapshot(b *testing.B) {
	n := benchLobbyGames()
	e, _ := benchLobby(b, n)
	fs := benchLobbyFilters(b)
	ctx := context.Background()
	var dst []Message
	items := 0
	evals := filter.Evals.Load()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		w, err := e.Watch(ctx, benchRoomName, WatchOptions{Prefixes: []string{"games/"}, Filter: fs[i%len(fs)]})
		if err != nil {
			b.Fatal(err)
		}
		if dst, err = w.Drain(dst[:0]); err != nil || len(dst) != 1 || dst[0].Kind != KindSnapshot {
			b.Fatalf("%v %+v, want a snapshot", err, dst)
		}
		items += len(dst[0].Items)
		defer w.Close()
	}
	b.StopTimer()
	if frac := float64(items) / float64(b.N*n); frac < 0.07 || frac > 0.11 {
		b.Fatalf("the filters selected %.1f %% of the games, want about 9 %%", 100*frac)
	}
	b.ReportMetric(float64(filter.Evals.Load()-evals)/float64(b.N), "evals/op")
}

// BenchmarkFilteredNotify: each op writes a random game and drains the
// 1,000 watchers (100 per filter) that got something.
func BenchmarkFilteredNotify(b *testing.B) {
	e, rng := benchLobby(b, benchLobbyGames())
	fs := benchLobbyFilters(b)
	ctx := context.Background()
	r := loadBenchRoom(b, e)
	r.mu.Lock()
	head := r.head
	r.mu.Unlock()
	ready := make(chan int, 1000) // the watchers that have messages
	ws := make([]*Watcher, 1000)
	for i := range ws {
		w, err := e.Watch(ctx, benchRoomName, WatchOptions{Prefixes: []string{"games/"}, Filter: fs[i%len(fs)],
			From: &Position{Rev: head + 1}, Notify: func() { ready <- i }})
		if err != nil {
			b.Fatal(err)
		}
		ws[i] = w
	}
	var dst []Message
	drain := func() int {
		n := 0
		for {
			select {
			case i := <-ready:
				var err error
				if dst, err = ws[i].Drain(dst[:0]); err != nil {
					b.Fatal(err)
				}
				n += len(dst)
			default:
				return n
			}
		}
	}
	drain() // the synced markers
	n := benchLobbyGames()
	vals := make([][]byte, 4096)
	for i := range vals {
		vals[i] = benchGame(rng)
	}
	evals, msgs := filter.Evals.Load(), 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := e.Apply(ctx, benchRoomName, store.Put(fmt.Sprintf("games/%05d", rng.IntN(n)), vals[i%len(vals)])); err != nil {
			b.Fatal(err)
		}
		msgs += drain()
	}
	b.StopTimer()
	b.ReportMetric(float64(filter.Evals.Load()-evals)/float64(b.N), "evals/op")
	b.ReportMetric(float64(msgs)/float64(b.N), "msgs/op")
	for _, w := range ws {
		w.Close()
	}
}
