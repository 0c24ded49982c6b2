package wire

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/coder/websocket"
)

// Codec encodes and decodes protocol frames in one encoding (PROTOCOL.md
// §2). Implementations are stateless and safe for concurrent use.
type Codec interface {
	// Subprotocol is the WebSocket subprotocol naming the codec.
	Subprotocol() string
	// Version is the protocol version it speaks, as connected's v says.
	Version() int
	// MessageType is the WebSocket frame type the codec sends.
	MessageType() websocket.MessageType
	// DecodeRequests decodes every message of a client frame. An error
	// wrapping ErrDecode means the frame is malformed and nothing of it
	// can be trusted. A *ValueError comes with every request of the
	// frame: those it names hold only T and ID and must be answered with
	// err invalid_value (ErrInvalidValue) or invalid_key (ErrInvalidKey);
	// the others are valid.
	DecodeRequests(frame []byte) ([]Request, error)
	// DecodeMessages decodes every message of a server frame; any error
	// wraps ErrDecode.
	DecodeMessages(frame []byte) ([]Message, error)
	// Append appends one message (a wire message struct, or a Request),
	// preceded by the frame separator when buf is not empty.
	Append(buf []byte, msg any) ([]byte, error)
	// AppendEventList appends the encoded array of evs, to be cached per
	// revision and spliced into frames by AppendEvents with the same rev
	// (version 2 leaves out a mod_rev equal to it). The JSON codecs write
	// Values as they are; MessagePack panics on a Value that is not valid
	// JSON. Every Value this package produces is canonical JSON.
	AppendEventList(buf []byte, rev uint64, evs []Event) []byte
	// AppendEvents appends (with separator) the message
	// {"t":t,"s":s,"rev":rev,"events":list} (version 2: "r" and "e"),
	// list coming from AppendEventList of the same codec and rev, copied
	// as is.
	AppendEvents(buf []byte, t string, s, rev uint64, list []byte) []byte
	// AppendEventsHead appends AppendEvents's message up to its list,
	// and EventsTail is what follows the list: head, a non-empty list and
	// tail are byte for byte AppendEvents's, so that a large list, shared
	// by every subscriber, is sent as a piece of its own rather than
	// copied into each subscriber's frame.
	AppendEventsHead(buf []byte, t string, s, rev uint64) []byte
	EventsTail() []byte
}

// Subprotocols of the codecs.
const (
	SubprotocolJSON    = "statecast.v1.json"
	SubprotocolMsgpack = "statecast.v1.msgpack"
	SubprotocolJSON2   = "statecast.v2.json"
)

// The codecs: protocol v1 in JSON and MessagePack, v2 in JSON.
var (
	JSON    Codec = jsonCodec{}
	Msgpack Codec = msgpackCodec{}
	JSON2   Codec = denseCodec{}
)

// ForSubprotocol returns the codec of a subprotocol; "" (none offered)
// means v1 JSON.
func ForSubprotocol(name string) (Codec, bool) {
	switch name {
	case "", SubprotocolJSON:
		return JSON, true
	case SubprotocolMsgpack:
		return Msgpack, true
	case SubprotocolJSON2:
		return JSON2, true
	}
	return nil, false
}

var (
	// ErrDecode: a frame or message is malformed (close 1007).
	ErrDecode = errors.New("wire: cannot decode message")
	// ErrInvalidValue: a value has no equivalent in the other codec
	// (PROTOCOL.md §2), answered with err invalid_value.
	ErrInvalidValue = errors.New("wire: value not representable")
	// ErrInvalidKey: a key or prefix is not valid Unicode (PROTOCOL.md
	// §2), answered with err invalid_key.
	ErrInvalidKey = errors.New("wire: key not valid Unicode")
)

// ValueError lists the requests of a frame whose value (or key) is
// rejected, by index into the requests DecodeRequests returned with it.
// Each error wraps ErrInvalidValue or ErrInvalidKey.
type ValueError struct {
	Errs map[int]error
}

// At returns the error of request i, or nil; e may be nil.
func (e *ValueError) At(i int) error {
	if e == nil {
		return nil
	}
	return e.Errs[i]
}

func (e *ValueError) indexes() []int {
	idx := make([]int, 0, len(e.Errs))
	for i := range e.Errs {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	return idx
}

func (e *ValueError) Error() string {
	var b strings.Builder
	for n, i := range e.indexes() {
		if n > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "message %d: %v", i, e.Errs[i])
	}
	return b.String()
}

// Unwrap lets errors.Is find ErrInvalidValue and ErrInvalidKey.
func (e *ValueError) Unwrap() []error {
	var errs []error
	for _, i := range e.indexes() {
		errs = append(errs, e.Errs[i])
	}
	return errs
}

// MaxFrameMessages bounds the requests in one client frame: a 1 MiB frame
// of empty maps would otherwise decode into a gigabyte of Requests. Rate
// and subscription limits keep honest clients far below it.
const MaxFrameMessages = 1024

// frameCodec is what the shared decoding below needs of a codec.
type frameCodec interface {
	// each calls fn with every message of frame, in order.
	each(frame []byte, fn func(msg []byte) error) error
	unmarshal(msg []byte, v any) error
	// checkRequest refuses, in r decoded from msg, what the reflective
	// decoder silently rewrote: a string that is not valid Unicode, a
	// negative integer wrapped into an unsigned field.
	checkRequest(msg []byte, r *Request) error
}

func decodeErr(i int, err error) error {
	if errors.Is(err, ErrDecode) {
		return fmt.Errorf("message %d: %w", i, err)
	}
	return fmt.Errorf("%w: message %d: %w", ErrDecode, i, err)
}

func decodeRequests(c frameCodec, frame []byte) ([]Request, error) {
	var reqs []Request
	var verr *ValueError
	err := c.each(frame, func(msg []byte) error {
		if len(reqs) == MaxFrameMessages {
			return fmt.Errorf("%w: more than %d messages in a frame", ErrDecode, MaxFrameMessages)
		}
		var r Request
		err := c.unmarshal(msg, &r)
		if err == nil {
			err = c.checkRequest(msg, &r)
		}
		if errors.Is(err, ErrInvalidValue) || errors.Is(err, ErrInvalidKey) {
			// Keep what the reply needs, if that much is well-formed.
			var head struct {
				T  string   `json:"t"`
				ID unsigned `json:"id"` // not wrapped from a negative msgpack int
			}
			if c.unmarshal(msg, &head) == nil {
				if verr == nil {
					verr = &ValueError{Errs: map[int]error{}}
				}
				verr.Errs[len(reqs)] = err
				r, err = Request{T: head.T, ID: uint64(head.ID)}, nil
			}
		}
		if err != nil {
			return decodeErr(len(reqs), err)
		}
		reqs = append(reqs, r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if verr != nil {
		return reqs, verr
	}
	return reqs, nil
}

func decodeMessages(c frameCodec, frame []byte) ([]Message, error) {
	return eachMessage(c, frame, func(msg []byte) (Message, error) {
		var m Message
		err := c.unmarshal(msg, &m)
		return m, err
	})
}

// eachMessage decodes every message of a server frame with decode.
func eachMessage(c frameCodec, frame []byte, decode func(msg []byte) (Message, error)) ([]Message, error) {
	var msgs []Message
	err := c.each(frame, func(msg []byte) error {
		m, err := decode(msg)
		if err != nil {
			return decodeErr(len(msgs), err)
		}
		msgs = append(msgs, m)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return msgs, nil
}

// appendWriter lets encoders write straight into a caller's buffer.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *appendWriter) WriteByte(c byte) error {
	w.b = append(w.b, c)
	return nil
}
