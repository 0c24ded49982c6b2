package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store/redistest"
)

// TestServeOnTLSRedis: `serve` on Redis that serves TLS only, with its own
// CA and client certificates required (the files in the store URL), as a
// standalone server and through Sentinels on TLS: a write on one node
// reaches a watcher on another (pub/sub over TLS too).
func TestServeOnTLSRedis(t *testing.T) {
	redistest.Require(t)
	statecastBin(t)
	tc := redistest.NewTLS(t)
	urls := map[string]string{
		"standalone": redistest.Start(t, redistest.Options{TLS: tc}).URL(),
		"sentinel":   redistest.StartFailover(t, 1, 1, time.Second, redistest.Options{TLS: tc}).URL(),
	}
	for name, url := range urls {
		t.Run(name, func(t *testing.T) {
			nodes := startNodesOn(t, 2, url)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := client.Dial(ctx, wsURL(nodes[1]), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			sub, err := c.Subscribe(ctx, "tls", client.SubscribeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if m, err := sub.Next(ctx); err != nil || m.T != wire.TSnapshot {
				t.Fatalf("first message %+v, %v: want a snapshot", m, err)
			}
			rev, err := (&client.HTTP{URL: nodes[0]}).Put(ctx, "tls", "k", json.RawMessage(`"v"`), nil, "")
			if err != nil {
				t.Fatal(err)
			}
			for {
				m, err := sub.Next(ctx)
				if err != nil {
					t.Fatalf("waiting for the write at %d on the other node: %v", rev, err)
				}
				if m.T == wire.TEvents && m.Rev == rev && len(m.Events) == 1 && string(m.Events[0].Value) == `"v"` {
					return
				}
			}
		})
	}
}
