package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/coder/websocket"
)

// jsonCodec speaks statecast.v1.json: text frames of compact JSON
// objects separated by '\n'.
type jsonCodec struct{}

func (jsonCodec) Subprotocol() string                { return SubprotocolJSON }
func (jsonCodec) Version() int                       { return 1 }
func (jsonCodec) MessageType() websocket.MessageType { return websocket.MessageText }

func (c jsonCodec) DecodeRequests(frame []byte) ([]Request, error) {
	return decodeRequests(c, frame)
}

func (c jsonCodec) DecodeMessages(frame []byte) ([]Message, error) {
	return decodeMessages(c, frame)
}

// each splits on '\n'; a message never holds a raw newline (JSON escapes
// it in strings), so lines are messages. Blank lines are skipped.
func (jsonCodec) each(frame []byte, fn func(msg []byte) error) error {
	// A text frame must be UTF-8 as a whole (RFC 6455 §8.1); encoding/json
	// would otherwise read each bad byte as U+FFFD.
	if !utf8.Valid(frame) {
		return fmt.Errorf("%w: a text frame must be valid UTF-8", ErrDecode)
	}
	n := 0
	for len(frame) > 0 {
		line := frame
		if i := bytes.IndexByte(frame, '\n'); i >= 0 {
			line, frame = frame[:i], frame[i+1:]
		} else {
			frame = nil
		}
		line = bytes.Trim(line, " \t\r")
		if len(line) == 0 {
			continue
		}
		// json.Unmarshal into a struct takes null as "nothing".
		if line[0] != '{' {
			return fmt.Errorf("%w: message %d is not an object", ErrDecode, n)
		}
		if err := fn(line); err != nil {
			return err
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("%w: empty frame", ErrDecode)
	}
	return nil
}

func (jsonCodec) unmarshal(msg []byte, v any) error { return json.Unmarshal(msg, v) }

func (jsonCodec) checkRequest(msg []byte, _ *Request) error { return checkJSONStrings(msg) }

// UnmarshalRequestJSON is json.Unmarshal for request-shaped JSON (the
// HTTP API's bodies), refusing what encoding/json would silently rewrite
// to U+FFFD, as the JSON codec does: a string with invalid UTF-8 or an
// escaped lone surrogate is ErrInvalidKey in a key, ErrInvalidValue in a
// value, ErrDecode in another field.
func UnmarshalRequestJSON(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return err
	}
	return checkJSONStrings(b)
}

// checkJSONStrings finds the first string of msg, a JSON object already
// decoded as a Request, that is not valid Unicode (raw invalid UTF-8, or
// an escaped lone surrogate) and says what it makes of the request, by
// the field holding it (PROTOCOL.md §2): ErrInvalidKey for a key or
// prefix, ErrInvalidValue inside a value, ErrDecode in another field.
// Unknown fields are ignored, as their decoding ignores them.
func checkJSONStrings(msg []byte) error {
	if utf8.Valid(msg) && !hasSurrogateEscape(msg) {
		return nil
	}
	type level struct {
		obj, atKey bool   // an object, and its next string is a field name
		field      string // an object's current field name
	}
	var open []level
	l := lexer{b: msg}
	for {
		k, tok := l.next()
		top := len(open) - 1
		switch k {
		case 0, 'x':
			return nil
		case '{', '[':
			open = append(open, level{obj: k == '{', atKey: k == '{'})
		case '}', ']':
			if top >= 0 {
				open = open[:top]
			}
		case ',':
			if top >= 0 && open[top].obj {
				open[top].atKey = true
			}
		case ':':
			if top >= 0 {
				open[top].atKey = false
			}
		case '"':
			u, ok := unquote(tok)
			if top >= 0 && open[top].atKey {
				open[top].field = string(u)
			}
			if ok && utf8.Valid(tok) {
				continue
			}
			var path []string // field names from the message down
			for _, lv := range open {
				if lv.obj {
					path = append(path, lv.field)
				}
			}
			if err := badStringError(path); err != nil {
				return err
			}
		}
	}
}

// badStringError classifies a string that is not valid Unicode by the
// request fields holding it; nil for fields a request does not have.
func badStringError(path []string) error {
	if len(path) == 0 {
		return fmt.Errorf("%w: a string is not valid Unicode", ErrDecode)
	}
	field := requestField(path[0])
	if (field == "if" || field == "ops") && len(path) > 1 {
		field = requestField(path[1]) // a condition's or an operation's field
	}
	switch field {
	case "value":
		return invalid("a string in the value is not valid Unicode (invalid UTF-8 or a lone surrogate escape)")
	case "key", "keys", "prefixes":
		return fmt.Errorf("%w: a %s is not valid Unicode (invalid UTF-8 or a lone surrogate escape)", ErrInvalidKey, strings.TrimSuffix(strings.TrimSuffix(field, "es"), "s"))
	case "t", "token", "session", "resume", "room", "lease", "from", "if", "ops", "type", "op", "filter":
		return fmt.Errorf("%w: field %q is not valid Unicode", ErrDecode, field)
	}
	return nil
}

// requestFields are the request fields whose strings are checked.
var requestFields = []string{"value", "key", "keys", "prefixes", "t", "token", "session", "resume", "room", "lease", "from", "if", "ops", "type", "op", "filter"}

// requestField returns the request field a JSON object's field name
// fills: encoding/json matches names case-insensitively, with Unicode
// folding ("KEY", and "\u212aey" with a Kelvin sign, fill "key"), and so
// must this check, or a differently spelt name would slip past it.
func requestField(name string) string {
	for _, f := range requestFields {
		if strings.EqualFold(name, f) {
			return f
		}
	}
	return name
}

// hasSurrogateEscape reports whether msg may hold an escaped surrogate
// (\uD800-\uDFFF); false positives only cost a closer look.
func hasSurrogateEscape(msg []byte) bool {
	for {
		i := bytes.Index(msg, []byte(`\u`))
		if i < 0 {
			return false
		}
		msg = msg[i+2:]
		if len(msg) > 0 && (msg[0] == 'd' || msg[0] == 'D') {
			return true
		}
	}
}

type jsonEncoder struct {
	w   appendWriter
	enc *json.Encoder
}

var jsonEncoders = sync.Pool{New: func() any {
	e := new(jsonEncoder)
	e.enc = json.NewEncoder(&e.w)
	e.enc.SetEscapeHTML(false) // values keep their text; frames are not HTML
	return e
}}

// appendJSON appends v as compact JSON.
func appendJSON(buf []byte, v any) ([]byte, error) {
	e := jsonEncoders.Get().(*jsonEncoder)
	e.w.b = buf
	err := e.enc.Encode(v)
	out := e.w.b
	e.w.b = nil
	jsonEncoders.Put(e)
	if err != nil {
		return buf, encodeErr(v, err)
	}
	return out[:len(out)-1], nil // Encode ends with '\n'
}

// encodeErr names a bad Value as such: Value is the only json.Marshaler
// in the messages, and the msgpack side already wraps ErrInvalidValue.
func encodeErr(v any, err error) error {
	var me *json.MarshalerError
	if errors.Is(err, ErrInvalidValue) {
		return err
	}
	if errors.As(err, &me) {
		return fmt.Errorf("%w: %v", ErrInvalidValue, err)
	}
	return fmt.Errorf("wire: cannot encode %T: %w", v, err)
}

func (jsonCodec) Append(buf []byte, msg any) ([]byte, error) {
	start := len(buf)
	if start > 0 {
		buf = append(buf, '\n')
	}
	out, err := appendJSON(buf, msg)
	if err != nil {
		return buf[:start], err
	}
	return out, nil
}

// AppendEventList writes what encoding/json would write for evs (field
// order, omitempty; TestEventListMatchesEncodingJSON), by hand: it runs
// at every commit (and for every revision a v1 client replays), where
// reflection and the check of each Value cost several times as much.
// Values are written as they are: every Value this package makes is
// canonical JSON.
func (jsonCodec) AppendEventList(buf []byte, _ uint64, evs []Event) []byte {
	buf = append(buf, '[')
	for i := range evs {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendEventJSON(buf, &evs[i])
	}
	return append(buf, ']')
}

func appendEventJSON(buf []byte, e *Event) []byte {
	buf = append(buf, `{"type":`...)
	buf = appendJSONString(buf, e.Type)
	buf = append(buf, `,"key":`...)
	buf = appendJSONString(buf, e.Key)
	if len(e.Value) > 0 {
		buf = append(buf, `,"value":`...)
		buf = append(buf, e.Value...)
	}
	if e.CreateRev != 0 {
		buf = strconv.AppendUint(append(buf, `,"create_rev":`...), e.CreateRev, 10)
	}
	buf = strconv.AppendUint(append(buf, `,"mod_rev":`...), e.ModRev, 10)
	if e.Version != 0 {
		buf = strconv.AppendUint(append(buf, `,"version":`...), e.Version, 10)
	}
	if e.Lease {
		buf = append(buf, `,"lease":true`...)
	}
	if p := e.Prev; p != nil {
		buf = append(buf, `,"prev":{"key":`...)
		buf = appendJSONString(buf, p.Key)
		buf = appendValueOrNull(append(buf, `,"value":`...), p.Value)
		buf = strconv.AppendUint(append(buf, `,"create_rev":`...), p.CreateRev, 10)
		buf = strconv.AppendUint(append(buf, `,"mod_rev":`...), p.ModRev, 10)
		buf = strconv.AppendUint(append(buf, `,"version":`...), p.Version, 10)
		if p.Lease {
			buf = append(buf, `,"lease":true`...)
		}
		buf = append(buf, '}')
	}
	if e.Wid != "" {
		buf = appendJSONString(append(buf, `,"wid":`...), e.Wid)
	}
	return append(buf, '}')
}

func (jsonCodec) AppendEvents(buf []byte, t string, s, rev uint64, list []byte) []byte {
	return appendEventsJSON(buf, t, s, `,"rev":`, rev, `,"events":`, list)
}

func (jsonCodec) AppendEventsHead(buf []byte, t string, s, rev uint64) []byte {
	return appendEventsHeadJSON(buf, t, s, `,"rev":`, rev, `,"events":`)
}

func (jsonCodec) EventsTail() []byte { return jsonEventsTail }

var jsonEventsTail = []byte("}")

// appendEventsJSON appends {"t":t,"s":s<revField>rev<listField>list}, the
// events envelope of both JSON versions.
func appendEventsJSON(buf []byte, t string, s uint64, revField string, rev uint64, listField string, list []byte) []byte {
	buf = appendEventsHeadJSON(buf, t, s, revField, rev, listField)
	if len(list) == 0 {
		list = []byte("[]")
	}
	buf = append(buf, list...)
	return append(buf, jsonEventsTail...)
}

// appendEventsHeadJSON appends appendEventsJSON's message up to its list.
func appendEventsHeadJSON(buf []byte, t string, s uint64, revField string, rev uint64, listField string) []byte {
	buf = appendHeadJSON(buf, t, s)
	buf = append(buf, revField...)
	buf = strconv.AppendUint(buf, rev, 10)
	return append(buf, listField...)
}

// appendHeadJSON appends (with separator) {"t":t,"s":s. The bulk
// messages' heads are constants: quoting t cost every delivered message a
// scan of it.
func appendHeadJSON(buf []byte, t string, s uint64) []byte {
	if len(buf) > 0 {
		buf = append(buf, '\n')
	}
	switch t {
	case TEvents:
		buf = append(buf, `{"t":"events","s":`...)
	case TCoalesced:
		buf = append(buf, `{"t":"coalesced","s":`...)
	case TSnapshot:
		buf = append(buf, `{"t":"snapshot","s":`...)
	default:
		buf = append(buf, `{"t":`...)
		buf = appendJSONString(buf, t)
		buf = append(buf, `,"s":`...)
	}
	return strconv.AppendUint(buf, s, 10)
}

// JSON text, for Values.

// canonical rewrites valid JSON text (checked by the caller, or by
// encoding/json before UnmarshalJSON) in the canonical form.
func canonical(b []byte) (Value, error) {
	if !utf8.Valid(b) {
		return nil, invalid("not valid UTF-8")
	}
	out := make([]byte, 0, len(b))
	l := lexer{b: b}
	depth := 0
	for {
		k, tok := l.next()
		switch k {
		case 0:
			return out, nil
		case 'x':
			return nil, fmt.Errorf("%w: malformed JSON", ErrDecode)
		case '[', '{':
			if depth++; depth > MaxValueDepth {
				return nil, invalid("nested deeper than %d", MaxValueDepth)
			}
		case ']', '}':
			depth--
		case '"':
			if bytes.IndexByte(tok, '\\') >= 0 {
				u, ok := unquote(tok)
				if !ok {
					return nil, invalid("lone surrogate escape in a string")
				}
				out = appendJSONString(out, u)
				continue
			}
			// Valid JSON has no raw control characters, so a string
			// without escapes is canonical already.
		case '0':
			if err := checkNumber(tok); err != nil {
				return nil, err
			}
		}
		out = append(out, tok...)
	}
}

// lexer splits JSON text into tokens: kind is the punctuation itself,
// '"' (tok is the quoted string), '0' (number), 't', 'f', 'n' (literals),
// 0 at the end, or 'x' for text that is not JSON. It does not check the
// grammar: its callers validate first, and it only guards against
// running off the end.
type lexer struct {
	b   []byte
	pos int
}

func (l *lexer) next() (kind byte, tok []byte) {
	for l.pos < len(l.b) && (l.b[l.pos] == ' ' || l.b[l.pos] == '\t' || l.b[l.pos] == '\n' || l.b[l.pos] == '\r') {
		l.pos++
	}
	if l.pos >= len(l.b) {
		return 0, nil
	}
	start, c := l.pos, l.b[l.pos]
	end := start + 1
	switch c {
	case '{', '}', '[', ']', ':', ',':
	case '"':
		for end < len(l.b) && l.b[end] != '"' {
			if l.b[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(l.b) {
			return 'x', nil
		}
		end++
	case 't', 'f', 'n':
		word := "null"
		if c == 't' {
			word = "true"
		} else if c == 'f' {
			word = "false"
		}
		if !bytes.HasPrefix(l.b[start:], []byte(word)) {
			return 'x', nil
		}
		end = start + len(word)
	default:
		if c != '-' && (c < '0' || c > '9') {
			return 'x', nil
		}
		for end < len(l.b) && strings.IndexByte("0123456789+-.eE", l.b[end]) >= 0 {
			end++
		}
		c = '0'
	}
	l.pos = end
	return c, l.b[start:end]
}

// unquote decodes a quoted JSON string. ok is false when it holds an
// escaped lone surrogate (\ud800): that is no Unicode character, which
// I-JSON (RFC 7493 §2.1) refuses and encoding/json would silently read
// as U+FFFD.
func unquote(q []byte) (out []byte, ok bool) {
	s := q[1 : len(q)-1]
	out = make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(s) {
			break
		}
		switch e := s[i+1]; e {
		case 'u':
			r := hex4(s[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if i+1 < len(s) && s[i] == '\\' && s[i+1] == 'u' {
					r2 = hex4(s[i+2:])
				}
				d := utf16.DecodeRune(r, r2)
				if d == utf8.RuneError {
					return nil, false
				}
				r, i = d, i+6
			}
			if r < 0 {
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
			continue
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		default: // '"', '\\', '/'
			out = append(out, e)
		}
		i += 2
	}
	return out, true
}

// hex4 reads four hex digits, or returns -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(d)
	}
	return r
}

// checkNumber rejects numbers beyond float64's range. Only an exponent,
// or more digits than float64 can hold, can get there.
func checkNumber(tok []byte) error {
	if len(tok) < 300 && !bytes.ContainsAny(tok, "eE") {
		return nil
	}
	_, err := parseNumber(string(tok))
	return err
}

// appendValueOrNull appends v as Value.MarshalJSON writes it: an empty
// Value is null.
func appendValueOrNull(buf []byte, v Value) []byte {
	if len(v) == 0 {
		return append(buf, "null"...)
	}
	return append(buf, v...)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s, valid UTF-8, in the canonical escaping.
func appendJSONString[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendJSONFloat appends f so that it reads back as the same float64,
// and as a float: 1 is written 1.0.
func appendJSONFloat(dst []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return dst, invalid("%v has no JSON equivalent", f)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'g', -1, 64)
	if !bytes.ContainsAny(dst[start:], ".e") {
		dst = append(dst, '.', '0')
	}
	return dst, nil
}
