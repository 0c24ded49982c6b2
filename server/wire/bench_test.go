package wire

import (
	"strings"
	"testing"

	"github.com/coder/websocket"
)

// value100 is a 100-byte JSON object.
var value100 = func() Value {
	v := `{"name":"Dune","players":3,"max":4,"open":true,"tags":["strategy","classic"],"owner":"u_`
	return Value(v + strings.Repeat("x", 100-len(v)-2) + `"}`)
}()

func BenchmarkAppendEvents(b *testing.B) {
	evs := []Event{{Type: "put", Key: "games/7", Value: value100, CreateRev: 12, ModRev: 58, Version: 6}}
	for _, cd := range codecs {
		b.Run(cd.name, func(b *testing.B) {
			list := cd.c.AppendEventList(nil, 0, evs)
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				buf = cd.c.AppendEvents(buf[:0], TEvents, 1, uint64(i), list)
			}
			b.SetBytes(int64(len(buf)))
		})
	}
}

func BenchmarkAppendEventList(b *testing.B) {
	evs := []Event{{Type: "put", Key: "games/7", Value: value100, CreateRev: 12, ModRev: 58, Version: 6}}
	for _, cd := range codecs {
		b.Run(cd.name, func(b *testing.B) {
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			for b.Loop() {
				buf = cd.c.AppendEventList(buf[:0], 0, evs)
			}
		})
	}
}

func BenchmarkAppend(b *testing.B) {
	for _, cd := range codecs {
		b.Run(cd.name, func(b *testing.B) {
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			for b.Loop() {
				buf, _ = cd.c.Append(buf[:0], &OK{T: TOK, ID: 2, Rev: 51})
			}
		})
	}
}

func BenchmarkDecodeRequests(b *testing.B) {
	req := &Request{T: TPut, ID: 2, Room: "lobby:eu", Key: "games/7", Value: value100, IfRev: u64(57)}
	for _, cd := range codecs {
		b.Run(cd.name, func(b *testing.B) {
			frame, err := cd.c.Append(nil, req)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := cd.c.DecodeRequests(frame); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeEvents: a client decoding a frame of 64 events messages
// of one 100-byte put each, as a subscription's stream arrives.
func BenchmarkDecodeEvents(b *testing.B) {
	for _, cd := range codecs {
		b.Run(cd.name, func(b *testing.B) {
			var frame []byte
			for i := range 64 {
				rev := uint64(100 + i)
				evs := []Event{{Type: "put", Key: "games/7", Value: value100, CreateRev: 12, ModRev: rev, Version: 6}}
				frame = cd.c.AppendEvents(frame, TEvents, 1, rev, cd.c.AppendEventList(nil, rev, evs))
				if cd.c.MessageType() == websocket.MessageText {
					frame = append(frame, '\n')
				}
			}
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := cd.c.DecodeMessages(frame); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
