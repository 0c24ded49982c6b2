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
	encoderOf(wire.JSON, false), encoderOf(wire.JSON, true),
	encoderOf(wire.Msgpack, false), encoderOf(wire.Msgpack, true),
	encoderOf(wire.JSON2, false), encoderOf(wire.JSON2, true),
}

func encoderOf(c wire.Codec, prev bool) func(*rooms.Change) []byte {
	return func(ch *rooms.Change) []byte {
		return c.AppendEventList(nil, ch.Rev, wireEvents(ch.Events, prev, ch.Filtered, nil))
	}
}

// denseSlot is the slot of protocol v2's JSON without previous values.
const denseSlot = 4

// PrepareChange caches, at commit time, the two JSON encodings: v2's,
// which the SDK and the Go client speak, and v1's, which clients written
// for v1 speak. A client resuming after missing thousands of revisions
// then gets bytes that are ready instead of waiting for each to be
// encoded (10,000 revisions: 6 ms against 20 for a v1 client, whose
// replay otherwise encodes them; each retained revision holds both).
func PrepareChange(ch *rooms.Change) {
	ch.Encoded(denseSlot, encoders[denseSlot])
	ch.Encoded(0, encoders[0])
}

// codecSlot is the first encoding slot of codec.
func codecSlot(c wire.Codec) int {
	switch c {
	case wire.Msgpack:
		return 2
	case wire.JSON2:
		return denseSlot
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
