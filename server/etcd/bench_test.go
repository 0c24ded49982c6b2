package etcd_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	statecast "github.com/statecast/statecast/client"
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
