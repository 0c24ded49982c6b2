package etcd_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	statecast "github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/etcd"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// BenchmarkWatchStream: the same work through each door: one watch
// receives a room's history of revisions (one put of a 100-byte JSON
// value each) from revision 1, through one etcd Watch stream with etcd's
// Go client, and through one WebSocket subscription with statecast's Go
// client (JSON). It reports events/s; -short shrinks the history.
func BenchmarkWatchStream(b *testing.B) {
	events := 10_000
	if testing.Short() {
		events = 1_000
	}
	n, _, cli := start(b, servertest.Options{})
	ctx := context.Background()
	value := []byte(`{"pos":[1,2],"name":"` + strings.Repeat("x", 70) + `"}`)
	for i := range events {
		if _, err := n.Engine.Apply(ctx, "bench", store.Put(fmt.Sprintf("k%04d", i%100), value)); err != nil {
			b.Fatal(err)
		}
	}
	run := func(b *testing.B, receive func() int) {
		start := time.Now()
		for b.Loop() {
			if got := receive(); got != events {
				b.Fatalf("received %d events, want %d", got, events)
			}
		}
		b.ReportMetric(float64(events*b.N)/time.Since(start).Seconds(), "events/s")
	}
	b.Run("etcd", func(b *testing.B) {
		run(b, func() int {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			got := 0
			for resp := range cli.Watch(ctx, "/bench/", clientv3.WithPrefix(), clientv3.WithRev(1)) {
				if err := resp.Err(); err != nil {
					b.Fatal(err)
				}
				if got += len(resp.Events); got >= events {
					break
				}
			}
			return got
		})
	})
	for _, codec := range []string{"json", "json2"} { // protocol v1 and v2
		b.Run("websocket-"+codec, func(b *testing.B) {
			conn, err := statecast.Dial(ctx, n.WS, &statecast.Options{Codec: codec})
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			run(b, func() int {
				sub, err := conn.Subscribe(ctx, "bench", statecast.SubscribeOptions{From: &wire.Position{Rev: 1}})
				if err != nil {
					b.Fatal(err)
				}
				defer func() { _ = sub.Unsubscribe(ctx) }()
				got := 0
				for got < events {
					m, err := sub.Next(ctx)
					if err != nil {
						b.Fatal(err)
					}
					got += len(m.Events)
				}
				return got
			})
		})
	}
}

// BenchmarkWatchFanout is the shape of etcd's benchmark `watch` command
// (docs/BENCHMARKS.md, "Against etcd"): 10 streams of 10 watches each on
// one key, one client putting to it one put at a time; each put is an
// event for all 100 watches. It reports events received a second, and
// the server's share of the work shows in a CPU profile of it.
func BenchmarkWatchFanout(b *testing.B) {
	const streams, perStream, puts = 10, 10, 500
	// etcd has no write rate per client: lift statecast's (200/s).
	_, addr, cli := start(b, servertest.Options{Server: server.Config{WriteRate: 1e6}})
	ctx := context.Background()
	key := "/bench/k"
	if _, err := cli.Put(ctx, key, "0"); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		wctx, cancel := context.WithCancel(ctx)
		got := make(chan int, streams*perStream)
		created := make(chan bool, streams*perStream)
		for range streams {
			c := client(b, addr, "") // a stream of its own, as the tool's
			for range perStream {
				wch := c.Watch(wctx, key, clientv3.WithCreatedNotify())
				go func() {
					created <- (<-wch).Created
					n := 0
					for resp := range wch {
						if n += len(resp.Events); n >= puts {
							break
						}
					}
					got <- n
				}()
			}
		}
		for range streams * perStream {
			if !<-created {
				b.Fatal("a watch was not created")
			}
		}
		start := time.Now()
		for i := range puts {
			if _, err := cli.Put(ctx, key, fmt.Sprint(i)); err != nil {
				b.Fatal(err)
			}
		}
		for range streams * perStream {
			if n := <-got; n < puts {
				b.Fatalf("a watch received %d events, want %d", n, puts)
			}
		}
		b.ReportMetric(float64(streams*perStream*puts)/time.Since(start).Seconds(), "events/s")
		cancel()
	}
}

// BenchmarkPutConcurrent is the shape of the put-64 row of etcd's
// benchmark tool (docs/BENCHMARKS.md, "Against etcd"): 64 clients over 8
// connections putting 256-byte values to keys of 8 bytes drawn from
// 100,000, into the keyspace of --etcd-default-room, on the durable file
// store. It reports puts/s; its CPU and allocation profiles show where a
// put's time goes (gRPC, the write path, the store's commit).
func BenchmarkPutConcurrent(b *testing.B) {
	const conns, clients, keys = 8, 64, 100_000
	st, err := store.OpenFile(store.FileConfig{Path: b.TempDir() + "/statecast.db"})
	if err != nil {
		b.Fatal(err)
	}
	_, addr, _ := startWith(b, servertest.Options{Store: st, Server: server.Config{WriteRate: 1e6}},
		etcd.Config{DefaultRoom: "bench"})
	var cs []*clientv3.Client
	for range conns {
		cs = append(cs, client(b, addr, ""))
	}
	value := strings.Repeat("v", 256)
	var next atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			cli := cs[i%conns]
			for n := next.Add(1); n <= int64(b.N); n = next.Add(1) {
				key := fmt.Sprintf("%08d", rand.IntN(keys))
				if _, err := cli.Put(context.Background(), key, value); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "puts/s")
}
