package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// A Value is canonical JSON text, the same whichever codec it came from:
//
//   - no insignificant whitespace; object key order (and any duplicate
//     keys) as written;
//   - strings escape only '"', '\' and control characters (\b \f \n \r \t,
//     others as \u00xx); everything else is literal UTF-8, so the text of
//     a string does not depend on how a client escaped it;
//   - JSON numbers keep their text exactly ("1.50", "1E2", "-0" stay);
//     MessagePack ints become their decimal text and floats the shortest
//     text that reads back to the same float64, with ".0" added when it
//     would otherwise read as an integer.
//
// Rejected with ErrInvalidValue: invalid UTF-8, an escaped lone surrogate
// (\ud800: no Unicode character, which encoding/json would silently read
// as U+FFFD), nesting deeper than MaxValueDepth, numbers beyond the
// float64 range (1e400), and from MessagePack bin, ext (timestamps
// included), non-string map keys, NaN and ±Inf.
//
// Reading a Value as MessagePack: numbers without fraction or exponent
// that fit int64 or uint64 become ints; every other number becomes a
// float64 (so "1.50" comes back as 1.5, integers beyond 64 bits are
// rounded, "-0" becomes 0). Hence Value → MessagePack → Value returns the
// same text except for such numbers, and MessagePack → Value →
// MessagePack returns the same value, float32 coming back as float64.

// MaxValueDepth is how deeply arrays and objects may nest in a Value.
const MaxValueDepth = 64

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidValue, fmt.Sprintf(format, args...))
}

// ValueFromJSON validates JSON text and returns it as a canonical Value.
// Malformed JSON wraps ErrDecode; JSON without a MessagePack equivalent
// wraps ErrInvalidValue.
func ValueFromJSON(b []byte) (Value, error) {
	if !json.Valid(b) {
		return nil, fmt.Errorf("%w: value is not valid JSON", ErrDecode)
	}
	return canonical(b)
}

// MarshalJSON emits the text as is; an empty Value is null.
func (v Value) MarshalJSON() ([]byte, error) {
	if len(v) == 0 {
		return []byte("null"), nil
	}
	return v, nil
}

// UnmarshalJSON stores the canonical form of b (which encoding/json has
// already checked to be one valid JSON value).
func (v *Value) UnmarshalJSON(b []byte) error {
	c, err := canonical(b)
	if err != nil {
		return err
	}
	*v = c
	return nil
}

// number is a JSON number as MessagePack reads it.
type number struct {
	kind byte // 'i', 'u' or 'f'
	i    int64
	u    uint64
	f    float64
}

func parseNumber(s string) (number, error) {
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return number{kind: 'i', i: i}, nil
		}
		if u, err := strconv.ParseUint(s, 10, 64); err == nil {
			return number{kind: 'u', u: u}, nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil { // beyond ±MaxFloat64 (tiny numbers just round to 0)
		return number{}, invalid("number %.40q out of float64 range", s)
	}
	return number{kind: 'f', f: f}, nil
}

// The msgpack decoder treats nil as "zero the Value" before calling
// DecodeMsgpack; registering the decoder directly makes nil read as JSON
// null, as it does from JSON, so that an absent value (nil) and a null
// one stay distinct.
func init() {
	msgpack.Register(Value(nil), nil, func(d *msgpack.Decoder, v reflect.Value) error {
		var x Value
		err := x.DecodeMsgpack(d)
		v.Set(reflect.ValueOf(x))
		return err
	})
}

var (
	_ msgpack.CustomEncoder = Value(nil)
	_ msgpack.CustomDecoder = (*Value)(nil)
)

// DecodeMsgpack reads one MessagePack value as JSON text. Errors wrap
// ErrInvalidValue (no JSON equivalent) or ErrDecode (malformed).
func (v *Value) DecodeMsgpack(d *msgpack.Decoder) error {
	out, err := appendMsgpackJSON(nil, d, 0)
	if err != nil {
		if !errors.Is(err, ErrInvalidValue) && !errors.Is(err, ErrDecode) {
			err = fmt.Errorf("%w: %v", ErrDecode, err) // the decoder's own, io.EOF etc.
		}
		return err
	}
	*v = out
	return nil
}

// appendMsgpackJSON converts the next value of d, streaming, so that map
// order is kept; depth counts the enclosing arrays and maps.
func appendMsgpackJSON(dst []byte, d *msgpack.Decoder, depth int) ([]byte, error) {
	c, err := d.PeekCode()
	if err != nil {
		return dst, err
	}
	switch {
	case c == msgpcode.Nil:
		return append(dst, "null"...), d.DecodeNil()
	case c == msgpcode.False || c == msgpcode.True:
		b, err := d.DecodeBool()
		return strconv.AppendBool(dst, b), err
	case c <= msgpcode.PosFixedNumHigh || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64):
		u, err := d.DecodeUint64()
		return strconv.AppendUint(dst, u, 10), err
	case c >= msgpcode.NegFixedNumLow || (c >= msgpcode.Int8 && c <= msgpcode.Int64):
		i, err := d.DecodeInt64()
		return strconv.AppendInt(dst, i, 10), err
	case c == msgpcode.Float:
		f, err := d.DecodeFloat32()
		if err != nil {
			return dst, err
		}
		return appendJSONFloat(dst, float64(f))
	case c == msgpcode.Double:
		f, err := d.DecodeFloat64()
		if err != nil {
			return dst, err
		}
		return appendJSONFloat(dst, f)
	case msgpcode.IsString(c):
		s, err := d.DecodeString()
		if err != nil {
			return dst, err
		}
		if !utf8.ValidString(s) {
			return dst, invalid("string is not valid UTF-8")
		}
		return appendJSONString(dst, s), nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		if depth == MaxValueDepth {
			return dst, invalid("nested deeper than %d", MaxValueDepth)
		}
		n, err := d.DecodeArrayLen()
		if err != nil {
			return dst, err
		}
		dst = append(dst, '[')
		for i := 0; i < n; i++ {
			if i > 0 {
				dst = append(dst, ',')
			}
			if dst, err = appendMsgpackJSON(dst, d, depth+1); err != nil {
				return dst, err
			}
		}
		return append(dst, ']'), nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		if depth == MaxValueDepth {
			return dst, invalid("nested deeper than %d", MaxValueDepth)
		}
		n, err := d.DecodeMapLen()
		if err != nil {
			return dst, err
		}
		dst = append(dst, '{')
		for i := 0; i < n; i++ {
			if i > 0 {
				dst = append(dst, ',')
			}
			if kc, err := d.PeekCode(); err != nil {
				return dst, err
			} else if !msgpcode.IsString(kc) {
				return dst, invalid("map key is not a string")
			}
			if dst, err = appendMsgpackJSON(dst, d, depth+1); err != nil {
				return dst, err
			}
			dst = append(dst, ':')
			if dst, err = appendMsgpackJSON(dst, d, depth+1); err != nil {
				return dst, err
			}
		}
		return append(dst, '}'), nil
	case msgpcode.IsBin(c):
		return dst, invalid("bin has no JSON equivalent; send base64 text")
	case msgpcode.IsExt(c):
		return dst, invalid("ext (or timestamp) has no JSON equivalent")
	}
	return dst, fmt.Errorf("%w: unknown MessagePack code %#x", ErrDecode, c)
}

// EncodeMsgpack writes the value as MessagePack; an empty Value is nil.
func (v Value) EncodeMsgpack(e *msgpack.Encoder) error {
	// Our own encoders write into a byte slice: append there directly.
	if w, ok := e.Writer().(*appendWriter); ok {
		b, err := appendValueMsgpack(w.b, v)
		if err == nil {
			w.b = b
		}
		return err
	}
	b, err := appendValueMsgpack(nil, v)
	if err == nil {
		_, err = e.Writer().Write(b)
	}
	return err
}

// MsgpackBytes returns the value encoded as MessagePack.
func (v Value) MsgpackBytes() ([]byte, error) { return appendValueMsgpack(nil, v) }

// appendValueMsgpack converts JSON text to MessagePack in two passes:
// MessagePack writes the length of arrays and maps first, so the first
// pass counts their elements.
func appendValueMsgpack(dst []byte, v Value) ([]byte, error) {
	if len(v) == 0 {
		return append(dst, msgpcode.Nil), nil
	}
	if !json.Valid(v) {
		return dst, invalid("not valid JSON")
	}
	if !utf8.Valid(v) {
		return dst, invalid("not valid UTF-8")
	}
	var countsBuf [16]int
	counts := countsBuf[:0] // elements of each container, in opening order
	type container struct {
		idx int // into counts
		obj bool
	}
	var open [MaxValueDepth]container
	depth := 0
	l := lexer{b: v}
	for k, _ := l.next(); k != 0; k, _ = l.next() {
		if k == 'x' {
			return dst, invalid("not valid JSON")
		}
		if depth > 0 {
			// An array counts its values, an object its colons.
			if c := open[depth-1]; (c.obj && k == ':') || (!c.obj && k != ',' && k != ']') {
				counts[c.idx]++
			}
		}
		switch k {
		case '[', '{':
			if depth == MaxValueDepth {
				return dst, invalid("nested deeper than %d", MaxValueDepth)
			}
			open[depth] = container{len(counts), k == '{'}
			depth++
			counts = append(counts, 0)
		case ']', '}':
			depth = max(depth-1, 0)
		}
	}
	l, next := lexer{b: v}, 0
	for {
		k, tok := l.next()
		switch k {
		case 0:
			return dst, nil
		case 'x':
			return dst, invalid("not valid JSON")
		case '[':
			dst = appendMsgpackLen(dst, msgpcode.FixedArrayLow, msgpcode.Array16, counts[next])
			next++
		case '{':
			dst = appendMsgpackLen(dst, msgpcode.FixedMapLow, msgpcode.Map16, counts[next])
			next++
		case '"':
			if bytes.IndexByte(tok, '\\') >= 0 {
				u, ok := unquote(tok)
				if !ok {
					return dst, invalid("lone surrogate escape in a string")
				}
				dst = appendMsgpackStr(dst, u)
			} else {
				dst = appendMsgpackStr(dst, tok[1:len(tok)-1])
			}
		case '0':
			n, err := parseNumber(string(tok))
			if err != nil {
				return dst, err
			}
			switch n.kind {
			case 'i':
				dst = appendMsgpackInt(dst, n.i)
			case 'u':
				dst = appendMsgpackUint(dst, n.u)
			default:
				dst = binary.BigEndian.AppendUint64(append(dst, msgpcode.Double), math.Float64bits(n.f))
			}
		case 't':
			dst = append(dst, msgpcode.True)
		case 'f':
			dst = append(dst, msgpcode.False)
		case 'n':
			dst = append(dst, msgpcode.Nil)
		}
	}
}
