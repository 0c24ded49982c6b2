package server

import (
	"errors"

	"github.com/labstack/echo/v4"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// A Change caches one encoding of its events per slot: codec × with or
// without previous values. encoders holds one func per slot, made once,
// so encoding a shared Change allocates no closure per socket.
var encoders = [rooms.MaxCodecs]func(*rooms.Change) []byte{
	func(ch *rooms.Change) []byte { return wire.JSON.AppendEventList(nil, wireEvents(ch.Events, false)) },
	func(ch *rooms.Change) []byte { return wire.JSON.AppendEventList(nil, wireEvents(ch.Events, true)) },
	func(ch *rooms.Change) []byte { return wire.Msgpack.AppendEventList(nil, wireEvents(ch.Events, false)) },
	func(ch *rooms.Change) []byte { return wire.Msgpack.AppendEventList(nil, wireEvents(ch.Events, true)) },
}

// PrepareChange caches the JSON encoding of a committed revision, the one
// most clients use, at commit time; pass it as rooms.Config.Prepare. A
// client resuming after missing thousands of revisions then gets bytes
// that are ready instead of waiting for each to be encoded.
func PrepareChange(ch *rooms.Change) { ch.Encoded(0, encoders[0]) }

// codecSlot is the first encoding slot of codec.
func codecSlot(c wire.Codec) int {
	if c == wire.Msgpack {
		return 2
	}
	return 0
}

func boolSlot(prev bool) int {
	if prev {
		return 1
	}
	return 0
}

// wireEvents converts store events to their wire form.
func wireEvents(evs []store.Event, prev bool) []wire.Event {
	out := make([]wire.Event, len(evs))
	for i, ev := range evs {
		e := &out[i]
		e.Key, e.ModRev, e.Wid = ev.KV.Key, ev.KV.ModRev, ev.Wid
		if ev.Type == store.OpPut {
			e.Type, e.Value = "put", wire.Value(ev.KV.Value)
			e.CreateRev, e.Version, e.Lease = ev.KV.CreateRev, ev.KV.Version, ev.KV.Lease != ""
		} else {
			e.Type = "delete"
		}
		if prev && ev.Prev != nil {
			p := wireItem(*ev.Prev)
			p.Key = ""
			e.Prev = &p
		}
	}
	return out
}

func wireItem(kv store.KV) wire.Item {
	return wire.Item{Key: kv.Key, Value: wire.Value(kv.Value), CreateRev: kv.CreateRev,
		ModRev: kv.ModRev, Version: kv.Version, Lease: kv.Lease != ""}
}

func wireItems(kvs []store.KV) []wire.Item {
	out := make([]wire.Item, len(kvs))
	for i, kv := range kvs {
		out[i] = wireItem(kv)
	}
	return out
}

func asHTTPError(err error, target **echo.HTTPError) bool { return errors.As(err, target) }
