package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// msgpackCodec speaks statecast.v1.msgpack: binary frames of concatenated
// maps keyed by the json tag names.
type msgpackCodec struct{}

func (msgpackCodec) Subprotocol() string                { return SubprotocolMsgpack }
func (msgpackCodec) Version() int                       { return 1 }
func (msgpackCodec) MessageType() websocket.MessageType { return websocket.MessageBinary }

func (c msgpackCodec) DecodeRequests(frame []byte) ([]Request, error) {
	return decodeRequests(c, frame)
}

func (c msgpackCodec) DecodeMessages(frame []byte) ([]Message, error) {
	return decodeMessages(c, frame)
}

// each cuts the frame into messages with msgpackLen before decoding any,
// so the reflective decoder never meets truncated, hostile or trailing
// data.
func (msgpackCodec) each(frame []byte, fn func(msg []byte) error) error {
	if len(frame) == 0 {
		return fmt.Errorf("%w: empty frame", ErrDecode)
	}
	for i := 0; len(frame) > 0; i++ {
		if c := frame[0]; !msgpcode.IsFixedMap(c) && c != msgpcode.Map16 && c != msgpcode.Map32 {
			return fmt.Errorf("%w: message %d is not a map", ErrDecode, i)
		}
		n, err := msgpackLen(frame)
		if err != nil {
			return fmt.Errorf("%w: message %d: %v", ErrDecode, i, err)
		}
		if err := fn(frame[:n]); err != nil {
			return err
		}
		frame = frame[n:]
	}
	return nil
}

type msgpackDecoder struct {
	r   bytes.Reader
	dec *msgpack.Decoder
}

var msgpackDecoders = sync.Pool{New: func() any {
	d := new(msgpackDecoder)
	d.dec = msgpack.NewDecoder(&d.r) // a ByteScanner: no extra buffering
	d.dec.SetCustomStructTag("json")
	return d
}}

func (msgpackCodec) unmarshal(msg []byte, v any) error {
	d := msgpackDecoders.Get().(*msgpackDecoder)
	d.r.Reset(msg)
	d.dec.ResetReader(&d.r) // keeps the struct tag
	err := d.dec.Decode(v)
	if err == nil && d.r.Len() > 0 {
		err = errors.New("trailing bytes")
	}
	d.r.Reset(nil)
	msgpackDecoders.Put(d)
	return err
}

// checkRequest refuses what the reflective decoder lets through: a negative
// int in an unsigned field (it wraps: id -5 would be answered as 2^64-5)
// and a str that is not UTF-8 (it becomes a Go string as is).
func (c msgpackCodec) checkRequest(msg []byte, r *Request) error {
	// A wrapped negative is 2^63 or more; only then look at the ints.
	const wrapped = 1 << 63
	high := r.ID >= wrapped || r.Sub >= wrapped || (r.IfRev != nil && *r.IfRev >= wrapped) ||
		(r.From != nil && r.From.Rev >= wrapped) || (r.Since != nil && *r.Since >= wrapped)
	for _, cond := range r.If {
		high = high || cond.ModRev >= wrapped
	}
	if high {
		if err := c.unmarshal(msg, &unsignedFields{}); err != nil {
			return err
		}
	}
	keys := append(append([]string{r.Key}, r.Prefixes...), r.Keys...)
	// Not wid: any byte outside printable ASCII there is bad_request, as
	// in JSON (store.ValidWid).
	others := []string{r.T, r.Token, r.Session, r.Resume, r.Room, r.Lease, r.Filter}
	if r.From != nil {
		others = append(others, r.From.Epoch)
	}
	for _, cond := range r.If {
		keys = append(keys, cond.Key)
	}
	for _, op := range r.Ops {
		keys = append(keys, op.Key)
		others = append(others, op.Type, op.Op, op.Lease)
	}
	for _, s := range others {
		if !utf8.ValidString(s) {
			return fmt.Errorf("%w: string %.40q is not valid UTF-8", ErrDecode, s)
		}
	}
	for _, k := range keys {
		if !utf8.ValidString(k) {
			return fmt.Errorf("%w: a key or prefix is not valid UTF-8", ErrInvalidKey)
		}
	}
	return nil
}

// unsignedFields are the unsigned fields of a Request, as checked ones.
type unsignedFields struct {
	ID    unsigned `json:"id"`
	Sub   unsigned `json:"sub"`
	IfRev unsigned `json:"if_rev"`
	Since unsigned `json:"since"`
	From  struct {
		Rev unsigned `json:"rev"`
	} `json:"from"`
	If []struct {
		ModRev unsigned `json:"mod_rev"`
	} `json:"if"`
}

// unsigned is a uint64 whose MessagePack decoding refuses a negative int,
// which the decoder would wrap around. encoding/json refuses it already.
type unsigned uint64

func (u *unsigned) DecodeMsgpack(d *msgpack.Decoder) error {
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	if (msgpcode.IsFixedNum(c) && c > msgpcode.PosFixedNumHigh) || (c >= msgpcode.Int8 && c <= msgpcode.Int64) {
		i, err := d.DecodeInt64()
		if err == nil && i < 0 {
			err = fmt.Errorf("%w: a negative integer where an unsigned one is expected", ErrDecode)
		}
		*u = unsigned(i)
		return err
	}
	n, err := d.DecodeUint64()
	*u = unsigned(n)
	return err
}

// maxFrameDepth bounds nesting in a message, as encoding/json does, so
// the decoder's recursion over unknown fields stays bounded. Values have
// their own, smaller limit (MaxValueDepth) that answers invalid_value.
const maxFrameDepth = 10000

var errTruncated = errors.New("truncated")

// msgpackLen returns the length of the MessagePack value b starts with,
// walking it without recursion.
func msgpackLen(b []byte) (int, error) {
	pos := 0
	var buf [16]int
	left := append(buf[:0], 1) // values still to read in each open container
	for len(left) > 0 {
		top := len(left) - 1
		if left[top] == 0 {
			left = left[:top]
			continue
		}
		left[top]--
		hdr, size, kids, err := msgpackHead(b[pos:])
		if err != nil {
			return 0, err
		}
		if size > len(b)-pos-hdr {
			return 0, errTruncated
		}
		pos += hdr + size
		if kids > 0 {
			// Each value takes a byte at least: refuse impossible counts
			// before trusting them.
			if kids > len(b)-pos {
				return 0, errTruncated
			}
			if len(left) > maxFrameDepth {
				return 0, fmt.Errorf("nested deeper than %d", maxFrameDepth)
			}
			left = append(left, kids)
		}
	}
	return pos, nil
}

// msgpackHead decodes the header of the value b starts with: its length
// hdr, then size bytes of payload, then kids nested values.
func msgpackHead(b []byte) (hdr, size, kids int, err error) {
	if len(b) == 0 {
		return 0, 0, 0, errTruncated
	}
	c := b[0]
	switch {
	case msgpcode.IsFixedNum(c), c == msgpcode.Nil, c == msgpcode.False, c == msgpcode.True:
		return 1, 0, 0, nil
	case msgpcode.IsFixedString(c):
		return 1, int(c & msgpcode.FixedStrMask), 0, nil
	case msgpcode.IsFixedArray(c):
		return 1, 0, int(c & msgpcode.FixedArrayMask), nil
	case msgpcode.IsFixedMap(c):
		return 1, 0, 2 * int(c&msgpcode.FixedMapMask), nil
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Int8:
		return 2, 0, 0, nil
	case msgpcode.Uint16, msgpcode.Int16:
		return 3, 0, 0, nil
	case msgpcode.Uint32, msgpcode.Int32, msgpcode.Float:
		return 5, 0, 0, nil
	case msgpcode.Uint64, msgpcode.Int64, msgpcode.Double:
		return 9, 0, 0, nil
	case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16:
		return 2, 1 << (c - msgpcode.FixExt1), 0, nil
	}
	// The rest carry a big-endian length of width bytes, then extra
	// header bytes (an ext's type); mult is 1 for arrays, 2 for maps.
	width, extra, mult := 0, 0, 0
	switch c {
	case msgpcode.Str8, msgpcode.Bin8:
		width = 1
	case msgpcode.Str16, msgpcode.Bin16:
		width = 2
	case msgpcode.Str32, msgpcode.Bin32:
		width = 4
	case msgpcode.Ext8:
		width, extra = 1, 1
	case msgpcode.Ext16:
		width, extra = 2, 1
	case msgpcode.Ext32:
		width, extra = 4, 1
	case msgpcode.Array16:
		width, mult = 2, 1
	case msgpcode.Array32:
		width, mult = 4, 1
	case msgpcode.Map16:
		width, mult = 2, 2
	case msgpcode.Map32:
		width, mult = 4, 2
	default:
		return 0, 0, 0, fmt.Errorf("unknown code %#x", c)
	}
	if len(b) < 1+width {
		return 0, 0, 0, errTruncated
	}
	var n int
	switch width {
	case 1:
		n = int(b[1])
	case 2:
		n = int(binary.BigEndian.Uint16(b[1:]))
	default:
		n = int(binary.BigEndian.Uint32(b[1:]))
	}
	if mult > 0 {
		return 1 + width, 0, mult * n, nil
	}
	return 1 + width + extra, n, 0, nil
}

type msgpackEncoder struct {
	w   appendWriter
	enc *msgpack.Encoder
}

var msgpackEncoders = sync.Pool{New: func() any {
	e := new(msgpackEncoder)
	e.enc = msgpack.NewEncoder(&e.w)
	e.enc.SetCustomStructTag("json")
	e.enc.UseCompactInts(true)
	return e
}}

func appendMsgpack(buf []byte, v any) ([]byte, error) {
	e := msgpackEncoders.Get().(*msgpackEncoder)
	e.w.b = buf
	err := e.enc.Encode(v)
	out := e.w.b
	e.w.b = nil
	msgpackEncoders.Put(e)
	if err != nil {
		return buf, encodeErr(v, err)
	}
	return out, nil
}

func (msgpackCodec) Append(buf []byte, msg any) ([]byte, error) {
	return appendMsgpack(buf, msg)
}

func (msgpackCodec) AppendEventList(buf []byte, _ uint64, evs []Event) []byte {
	if len(evs) == 0 {
		return append(buf, msgpcode.FixedArrayLow)
	}
	out, err := appendMsgpack(buf, evs)
	if err != nil {
		panic(err)
	}
	return out
}

func (c msgpackCodec) AppendEvents(buf []byte, t string, s, rev uint64, list []byte) []byte {
	buf = c.AppendEventsHead(buf, t, s, rev)
	if len(list) == 0 {
		return append(buf, msgpcode.FixedArrayLow)
	}
	return append(buf, list...)
}

func (msgpackCodec) AppendEventsHead(buf []byte, t string, s, rev uint64) []byte {
	buf = append(buf, msgpcode.FixedMapLow|4)
	buf = appendMsgpackStr(buf, "t")
	buf = appendMsgpackStr(buf, t)
	buf = appendMsgpackStr(buf, "s")
	buf = appendMsgpackUint(buf, s)
	buf = appendMsgpackStr(buf, "rev")
	buf = appendMsgpackUint(buf, rev)
	return appendMsgpackStr(buf, "events")
}

// EventsTail is empty: a MessagePack map ends with its last value.
func (msgpackCodec) EventsTail() []byte { return nil }

// appendMsgpackUint writes u in its shortest form, as UseCompactInts does.
func appendMsgpackUint(b []byte, u uint64) []byte {
	switch {
	case u <= uint64(msgpcode.PosFixedNumHigh):
		return append(b, byte(u))
	case u <= 0xff:
		return append(b, msgpcode.Uint8, byte(u))
	case u <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Uint16), uint16(u))
	case u <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, msgpcode.Uint32), uint32(u))
	}
	return binary.BigEndian.AppendUint64(append(b, msgpcode.Uint64), u)
}

func appendMsgpackInt(b []byte, i int64) []byte {
	switch {
	case i >= 0:
		return appendMsgpackUint(b, uint64(i))
	case i >= -32:
		return append(b, byte(i)) // negative fixnum
	case i >= math.MinInt8:
		return append(b, msgpcode.Int8, byte(i))
	case i >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Int16), uint16(i))
	case i >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, msgpcode.Int32), uint32(i))
	}
	return binary.BigEndian.AppendUint64(append(b, msgpcode.Int64), uint64(i))
}

// appendMsgpackLen writes an array or map header: fix is the code of the
// fixed form, code16 of the 16-bit one (the 32-bit one follows it).
func appendMsgpackLen(b []byte, fix, code16 byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, fix|byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, code16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, code16+1), uint32(n))
}

func appendMsgpackStr[S ~string | ~[]byte](b []byte, s S) []byte {
	switch n := len(s); {
	case n <= int(msgpcode.FixedStrMask):
		b = append(b, msgpcode.FixedStrLow|byte(n))
	case n <= 0xff:
		b = append(b, msgpcode.Str8, byte(n))
	case n <= 0xffff:
		b = binary.BigEndian.AppendUint16(append(b, msgpcode.Str16), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, msgpcode.Str32), uint32(n))
	}
	return append(b, s...)
}
