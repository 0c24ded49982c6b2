package server

import (
	"errors"

	"github.com/labstack/echo/v4"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/internal/wireconv"
	"github.com/statecast/statecast/server/wire"
)

// A Change caches one encoding of its events per slot: codec × with or
// without previous values. encoders holds one func per slot, made once,
// so encoding a shared Change allocates no closure per socket.
var encoders = [rooms.MaxCodecs]func(*rooms.Change) []byte{
	func(ch *rooms.Change) []byte {
		return wire.JSON.AppendEventList(nil, wireEvents(ch.Events, false, ch.Filtered))
	},
	func(ch *rooms.Change) []byte {
		return wire.JSON.AppendEventList(nil, wireEvents(ch.Events, true, ch.Filtered))
	},
	func(ch *rooms.Change) []byte {
		return wire.Msgpack.AppendEventList(nil, wireEvents(ch.Events, false, ch.Filtered))
	},
	func(ch *rooms.Change) []byte {
		return wire.Msgpack.AppendEventList(nil, wireEvents(ch.Events, true, ch.Filtered))
	},
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

// The protocol form of events and keys, shared with the webhooks.
var (
	wireEvents = wireconv.Events
	wireItem   = wireconv.Item
	wireItems  = wireconv.Items
)

func asHTTPError(err error, target **echo.HTTPError) bool { return errors.As(err, target) }
