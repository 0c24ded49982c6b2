package server

import (
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/labstack/echo/v4"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/internal/wireconv"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
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

// snapPiece is about how many bytes of a snapshot's items each piece of
// its shared encoding holds: a frame's worth, so a large snapshot goes to
// the socket in frames written from the shared pieces, never copied into
// a subscriber's own buffer.
const snapPiece = maxFrame

// snapSlack is the room a piece leaves for the item that crosses
// snapPiece; a larger item grows it.
const snapSlack = 4 << 10

// snapshotEncoders encode a snapshot's items once per codec, shared by
// every subscription that gets that snapshot (rooms.Snapshot.Encoded),
// indexed by the codec's first slot.
var snapshotEncoders = [rooms.MaxCodecs]func([]store.KV) [][]byte{
	0: snapshotEncoderOf(wire.JSON), 2: snapshotEncoderOf(wire.Msgpack), denseSlot: snapshotEncoderOf(wire.JSON2),
}

// snapshotEncodings counts the snapshot encodings made, for tests.
var snapshotEncodings atomic.Int64

// snapshotEncoderOf returns the items' encoding in c's form, in pieces of
// about snapPiece bytes cut at item boundaries; nil when an item cannot
// be encoded (never for a Value this package made).
func snapshotEncoderOf(c wire.Codec) func([]store.KV) [][]byte {
	return func(kvs []store.KV) [][]byte {
		snapshotEncodings.Add(1)
		pieces := [][]byte{}
		piece := make([]byte, 0, snapPiece+snapSlack)
		one := make([]wire.Item, 1)
		for i, kv := range kvs {
			one[0] = wireItem(kv)
			var err error
			if piece, err = wire.AppendSnapshotItems(c, piece, one, i == 0); err != nil {
				slog.Error("server: cannot encode a snapshot", "key", kv.Key, "err", err)
				return nil
			}
			if len(piece) >= snapPiece {
				pieces = append(pieces, piece)
				piece = make([]byte, 0, snapPiece+snapSlack)
			}
		}
		if len(piece) > 0 {
			pieces = append(pieces, piece)
		}
		return pieces
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
