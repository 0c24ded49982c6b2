package redisstore

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// Benchmarks against a redis-server each benchmark starts (no
// persistence). They measure the client side too: on a 2-core machine the
// Go process and redis-server share the cores.

func benchStore(b *testing.B) *Store {
	b.Helper()
	srv := redistest.Start(b, redistest.Options{})
	return openStore(b, srv.URL(), nil)
}

// BenchmarkApply: one writer, one put of 100 bytes per write.
func BenchmarkApply(b *testing.B) {
	s := benchStore(b)
	v := make([]byte, 100)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Apply(bg, "bench", store.Put(fmt.Sprint("k", i%100), v)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyParallel: 8 writers per core over 100 rooms.
func BenchmarkApplyParallel(b *testing.B) {
	s := benchStore(b)
	parallelWrites(b, s, 8, 100)
}

// BenchmarkApplyGroup: 64 concurrent writers (the group commit), to one
// room and over 100 and 200 rooms, on one Redis server; besides the time
// per write it reports the Redis server's CPU per write and the writes
// per script call (one call per room and round trip).
func BenchmarkApplyGroup(b *testing.B) {
	for _, rooms := range []int{1, 100, 200} {
		b.Run(fmt.Sprint("rooms=", rooms), func(b *testing.B) {
			srv := redistest.Start(b, redistest.Options{})
			s := openStore(b, srv.URL(), nil)
			raw := rawRedis(b, srv.Addr())
			calls0, _ := calls(b, raw, "evalsha")
			cpu0 := srv.CPU()
			parallelWrites(b, s, 32, rooms)
			b.StopTimer()
			calls1, _ := calls(b, raw, "evalsha")
			b.ReportMetric(float64((srv.CPU()-cpu0).Microseconds())/float64(b.N), "redis-µs/op")
			b.ReportMetric(float64(b.N)/float64(max(1, calls1-calls0)), "writes/call")
		})
	}
}

// BenchmarkApplyCluster: 64 concurrent writers over 200 rooms on a Redis
// Cluster of 1, 2 and 4 masters (slots in equal ranges). It reports the
// masters' CPU per write, busiest-master-% (the share of the time the
// busiest master was on a CPU) and ceiling-writes/s, the writes per second
// of that master's CPU: the rate at which it would fill a core, the
// Redis-bound ceiling. On a machine with fewer cores than masters plus
// this process, the measured rate stops growing well before it.
func BenchmarkApplyCluster(b *testing.B) {
	for _, masters := range []int{1, 2, 4} {
		b.Run(fmt.Sprint("masters=", masters), func(b *testing.B) {
			c := redistest.StartCluster(b, masters)
			s := openStore(b, strings.Join(c.Addrs(), ","), func(cfg *Config) { cfg.Cluster = true })
			cpu0 := make([]time.Duration, masters)
			for i, n := range c.Nodes {
				cpu0[i] = n.CPU()
			}
			start := time.Now()
			parallelWrites(b, s, 32, 200)
			b.StopTimer()
			took := time.Since(start)
			var sum, busiest time.Duration
			for i, n := range c.Nodes {
				d := n.CPU() - cpu0[i]
				sum += d
				busiest = max(busiest, d)
			}
			b.ReportMetric(float64(sum.Microseconds())/float64(b.N), "redis-µs/op")
			b.ReportMetric(100*busiest.Seconds()/took.Seconds(), "busiest-master-%")
			b.ReportMetric(float64(b.N)/busiest.Seconds(), "ceiling-writes/s")
		})
	}
}

// parallelWrites runs b.N puts of 100 bytes from perCore writers per core,
// over rooms rooms in turn.
func parallelWrites(b *testing.B, s *Store, perCore, rooms int) {
	v := make([]byte, 100)
	var n atomic.Int64
	b.SetParallelism(perCore)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if _, err := s.Apply(bg, fmt.Sprint("room", i%int64(rooms)), store.Put(fmt.Sprint("k", i%10), v)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkFollowLatency: time from Apply's call to the follower's
// callback (script, SPUBLISH, the push connection, decode, sequencer), one
// write at a time, over 1 and 100 followed rooms.
func BenchmarkFollowLatency(b *testing.B) {
	for _, rooms := range []int{1, 100} {
		b.Run(fmt.Sprint("rooms=", rooms), func(b *testing.B) {
			s := benchStore(b)
			got := make(chan time.Time, 1)
			for r := range rooms {
				stop, err := s.Follow(fmt.Sprint("room", r), func(store.Batch) { got <- time.Now() })
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(stop)
			}
			time.Sleep(100 * time.Millisecond) // subscriptions confirmed
			v := make([]byte, 100)
			var lat []time.Duration
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				start := time.Now()
				if _, err := s.Apply(bg, fmt.Sprint("room", i%rooms), store.Put("k", v)); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, (<-got).Sub(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkHistory: replay of 1000 revisions.
func BenchmarkHistory(b *testing.B) {
	s := benchStore(b)
	v := make([]byte, 100)
	for i := range 1000 {
		if _, err := s.Apply(bg, "hist", store.Put(fmt.Sprint("k", i%100), v)); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		bs, err := s.History(bg, "hist", 1, 0)
		if err != nil || len(bs) != 1000 {
			b.Fatal(len(bs), err)
		}
	}
}

// BenchmarkSnapshot: a room of 1000 keys.
func BenchmarkSnapshot(b *testing.B) {
	s := benchStore(b)
	v := make([]byte, 100)
	for i := range 1000 {
		if _, err := s.Apply(bg, "snap", store.Put(fmt.Sprint("k", i), v)); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		snap, err := s.Snapshot(bg, "snap", "")
		if err != nil || len(snap.Items) != 1000 {
			b.Fatal(len(snap.Items), err)
		}
	}
}

// BenchmarkBigSnapshot: a room of 50,000 keys, snapshotted by one
// MULTI with HGETALL and in HSCAN pages. Besides the time per snapshot it
// reports the longest single command Redis ran (SLOWLOG), which is how
// long every other room's reads and writes had to wait.
func BenchmarkBigSnapshot(b *testing.B) {
	for _, tc := range []struct {
		name  string
		above int
	}{{"one-multi", 1 << 30}, {"paged", 5000}} {
		b.Run(tc.name, func(b *testing.B) {
			srv := redistest.Start(b, redistest.Options{})
			s := openStore(b, srv.URL(), func(c *Config) { c.SnapshotPageAbove = tc.above })
			raw := rawRedis(b, srv.Addr())
			v := make([]byte, 100)
			for i := 0; i < 50_000; i += 100 {
				var w store.Write
				for j := i; j < i+100; j++ {
					w.Ops = append(w.Ops, store.Op{Type: store.OpPut, Key: fmt.Sprint("k", j), Value: v})
				}
				if _, err := s.Apply(bg, "big", w); err != nil {
					b.Fatal(err)
				}
			}
			if err := raw.ConfigSet(bg, "slowlog-log-slower-than", "0").Err(); err != nil {
				b.Fatal(err)
			}
			raw.SlowLogReset(bg)
			b.ResetTimer()
			for b.Loop() {
				snap, err := s.Snapshot(bg, "big", "")
				if err != nil || len(snap.Items) != 50_000 {
					b.Fatal(len(snap.Items), err)
				}
			}
			b.StopTimer()
			logs, err := raw.SlowLogGet(bg, 10_000).Result()
			if err != nil {
				b.Fatal(err)
			}
			var longest time.Duration
			for _, l := range logs {
				longest = max(longest, l.Duration)
			}
			b.ReportMetric(float64(longest.Microseconds()), "longest-cmd-µs")
		})
	}
}
