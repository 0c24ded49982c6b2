package client_test

import (
	"context"
	"testing"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

// BenchmarkPut measures pipelined writes on one connection, client and
// in-process server together.
func BenchmarkPut(b *testing.B) {
	for _, codec := range codecs {
		b.Run(codec, func(b *testing.B) {
			s := servertest.Start(b, servertest.Options{Server: server.Config{WriteRate: 1e9}})
			c, err := client.Dial(context.Background(), s.WS, &client.Options{Codec: codec})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			v := wire.Value(`{"x":1,"name":"player"}`)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Put(context.Background(), "bench", "k", v); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
