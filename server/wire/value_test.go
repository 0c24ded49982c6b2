package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestValueFromJSON(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{` { "b" : 1 , "a" : [ true , false , null ] } `, `{"b":1,"a":[true,false,null]}`},
		{`{"k":1,"k":2}`, `{"k":1,"k":2}`}, // duplicates kept, in order
		{`"\u0041\/\u00e9\ud83d\ude00"`, `"A/é😀"`},
		{`"\"\\\b\f\n\r\t\u0000\u001f\u007f"`, `"\"\\\b\f\n\r\t\u0000\u001f` + "\x7f\""},
		{`"<&>\u2028"`, "\"<&>\u2028\""},
		{`"\ufffd\uD83D\uDE00"`, `"` + "\uFFFD😀" + `"`}, // U+FFFD itself is a character
		{`1.50`, `1.50`}, {`1E2`, `1E2`}, {`-0`, `-0`}, {`1e-400`, `1e-400`},
		{`18446744073709551616`, `18446744073709551616`},
		{`[]`, `[]`}, {`{}`, `{}`}, {`""`, `""`},
		{nestedJSON(MaxValueDepth, "1"), nestedJSON(MaxValueDepth, "1")},
	} {
		v, err := ValueFromJSON([]byte(tc.in))
		if err != nil || string(v) != tc.want {
			t.Errorf("ValueFromJSON(%s) = %s, %v; want %s", tc.in, v, err, tc.want)
		}
		var u Value
		if err := json.Unmarshal([]byte(tc.in), &u); err != nil || string(u) != tc.want {
			t.Errorf("UnmarshalJSON(%s) = %s, %v", tc.in, u, err)
		}
	}
	for _, tc := range []struct {
		in   string
		want error
	}{
		{``, ErrDecode}, {`1 2`, ErrDecode}, {`{"a":}`, ErrDecode}, {`[1,]`, ErrDecode}, {`nul`, ErrDecode},
		{nestedJSON(MaxValueDepth+1, ""), ErrInvalidValue},
		{`{"a":` + nestedJSON(MaxValueDepth, "") + `}`, ErrInvalidValue},
		{`1e400`, ErrInvalidValue}, {`[-1e400]`, ErrInvalidValue},
		{"\"\xff\"", ErrInvalidValue},
		// Lone surrogates are no characters (I-JSON, RFC 7493 §2.1), not U+FFFD.
		{`"\ud800"`, ErrInvalidValue}, {`"\udc00\ud800"`, ErrInvalidValue}, {`["a\uD800b"]`, ErrInvalidValue},
		{`{"\ud83d":1}`, ErrInvalidValue}, {`"\ud800\u0041"`, ErrInvalidValue}, {`"\ud800\\udc00"`, ErrInvalidValue},
	} {
		if v, err := ValueFromJSON([]byte(tc.in)); !errors.Is(err, tc.want) {
			t.Errorf("ValueFromJSON(%.30s) = %s, %v; want %v", tc.in, v, err, tc.want)
		}
	}
}

func TestValueMarshalJSON(t *testing.T) {
	b, err := json.Marshal(struct {
		A Value `json:"a"`
		B Value `json:"b,omitempty"`
		C Value `json:"c"`
	}{C: Value(`{"x":[1]}`)})
	if err != nil || string(b) != `{"a":null,"c":{"x":[1]}}` {
		t.Errorf("got %s, %v", b, err)
	}
}

// MessagePack → Value text.
func TestValueFromMsgpack(t *testing.T) {
	f32 := func(f float32) node { return node{Kind: "f32", F: float64(f)} }
	f64 := func(f float64) node { return node{Kind: "f64", F: f} }
	for _, tc := range []struct {
		in   node
		want string
	}{
		{node{Kind: "nil"}, `null`},
		{node{Kind: "bool", B: true}, `true`},
		{node{Kind: "int", I: math.MinInt64}, `-9223372036854775808`},
		{node{Kind: "int", I: -1}, `-1`},
		{node{Kind: "uint", U: math.MaxUint64}, `18446744073709551615`},
		{f64(1), `1.0`}, {f64(math.Copysign(0, -1)), `-0.0`}, {f64(0.1), `0.1`},
		{f64(1e21), `1e+21`}, {f64(123456), `123456.0`}, {f64(1e-7), `1e-07`},
		{f64(math.MaxFloat64), `1.7976931348623157e+308`}, {f64(5e-324), `5e-324`},
		{f32(0.1), `0.10000000149011612`}, {f32(2), `2.0`},
		{node{Kind: "str", S: "a\"\\\n\x00\x1f\x7f<é>\u2028😀"}, `"a\"\\\n\u0000\u001f` + "\x7f<é>\u2028😀\""},
		{node{Kind: "arr", Kids: []node{{Kind: "int", I: 1}, {Kind: "arr"}, {Kind: "map"}}}, `[1,[],{}]`},
		{node{Kind: "map", Keys: []string{"z", "a", "z"}, Kids: []node{{Kind: "int", I: 1}, {Kind: "nil"}, {Kind: "str", S: "x"}}},
			`{"z":1,"a":null,"z":"x"}`},
	} {
		var v Value
		b := msgpackOf(t, tc.in)
		if err := msgpack.Unmarshal(b, &v); err != nil || string(v) != tc.want {
			t.Errorf("%x → %s, %v; want %s", b, v, err, tc.want)
		}
	}
	// float64 -0 from raw bytes, in case the encoder normalizes it.
	var v Value
	if err := msgpack.Unmarshal([]byte{0xcb, 0x80, 0, 0, 0, 0, 0, 0, 0}, &v); err != nil || string(v) != "-0.0" {
		t.Errorf("-0: %s, %v", v, err)
	}
}

// Value text → MessagePack, read back as nodes (normalized: ints by value).
func TestValueToMsgpack(t *testing.T) {
	i := func(n int64) node { return node{Kind: "int", I: n} }
	f := func(x float64) node { return node{Kind: "f64", F: x} }
	for _, tc := range []struct {
		in   string
		want node
	}{
		{`0`, i(0)}, {`-0`, i(0)}, {`-9223372036854775808`, i(math.MinInt64)},
		{`18446744073709551615`, node{Kind: "uint", U: math.MaxUint64}},
		{`18446744073709551616`, f(18446744073709551616)}, {`-9223372036854775809`, f(-9223372036854775809)},
		{`1.0`, f(1)}, {`1E2`, f(100)}, {`1.50`, f(1.5)}, {`-0.0`, f(math.Copysign(0, -1))}, {`1e-400`, f(0)},
		{`0.1`, f(0.1)}, {`"x\u0000"`, node{Kind: "str", S: "x\x00"}},
		{`{"b":[null,true],"a":{}}`, node{Kind: "map", Keys: []string{"b", "a"}, Kids: []node{
			{Kind: "arr", Kids: []node{{Kind: "nil"}, {Kind: "bool", B: true}}}, {Kind: "map", Keys: []string{}, Kids: []node{}}}}},
	} {
		b, err := Value(tc.in).MsgpackBytes()
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if diff := diffNodes(tc.want.normal(), nodeOfMsgpack(t, b)); diff != "" {
			t.Errorf("%s: %s", tc.in, diff)
		}
	}
	for _, bad := range []string{`{`, `1 2`, `]`, `1e400`, nestedJSON(MaxValueDepth+1, "")} {
		if _, err := Value(bad).MsgpackBytes(); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("%.20s: %v", bad, err)
		}
	}
	if b, err := Value(nil).MsgpackBytes(); err != nil || !bytes.Equal(b, []byte{0xc0}) {
		t.Errorf("nil: %x, %v", b, err)
	}
}

// What a trip through the other codec changes, and what it keeps: every
// case documented in value.go.
func TestValueRoundTripChanges(t *testing.T) {
	for _, tc := range []struct{ json, back string }{
		{`1.50`, `1.5`}, {`1E2`, `100.0`}, {`1e+21`, `1e+21`}, {`-0`, `0`}, {`-0.0`, `-0.0`}, {`1e-400`, `0.0`},
		{`18446744073709551616`, `1.8446744073709552e+19`}, {`0.1`, `0.1`}, {`1.0`, `1.0`},
		{`123456789012345678901234567890`, `1.2345678901234568e+29`},
		{`3.141592653589793238462643383279`, `3.141592653589793`},
		{richValue, richValue},
	} {
		v, err := ValueFromJSON([]byte(tc.json))
		if err != nil {
			t.Fatal(err)
		}
		if got := viaMsgpack(t, v); string(got) != tc.back {
			t.Errorf("%s → %s, want %s", tc.json, got, tc.back)
		}
	}
}

func viaMsgpack(t tb, v Value) Value {
	t.Helper()
	b, err := v.MsgpackBytes()
	if err != nil {
		t.Fatalf("%s: %v", v, err)
	}
	var out Value
	if err := msgpack.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: %x: %v", v, b, err)
	}
	return out
}

func TestValueDepthLimit(t *testing.T) {
	var v Value
	if err := msgpack.Unmarshal(nestedMsgpack(MaxValueDepth), &v); err != nil || string(v) != nestedJSON(MaxValueDepth, "null") {
		t.Errorf("depth %d: %v", MaxValueDepth, err)
	}
	if err := msgpack.Unmarshal(nestedMsgpack(MaxValueDepth+1), &v); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("depth %d: %v", MaxValueDepth+1, err)
	}
	// A map level counts too.
	deep := append(bytes.Repeat([]byte{0x81, 0xa1, 'k'}, MaxValueDepth+1), 0xc0)
	if err := msgpack.Unmarshal(deep, &v); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("map depth: %v", err)
	}
	// A million levels return quickly, without growing the stack.
	if err := msgpack.Unmarshal(nestedMsgpack(1e6), &v); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("1e6: %v", err)
	}
	if _, err := ValueFromJSON([]byte(nestedJSON(1000, ""))); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("JSON 1000: %v", err)
	}
	// Beyond encoding/json's own limit (10000) JSON is malformed, as the
	// frames of both codecs are.
	if _, err := ValueFromJSON([]byte(nestedJSON(1e6, ""))); !errors.Is(err, ErrDecode) {
		t.Errorf("JSON 1e6: %v", err)
	}
}

func TestValueMsgpackTruncated(t *testing.T) {
	full := msgpackOf(t, node{Kind: "map", Keys: []string{"a", "b"}, Kids: []node{{Kind: "str", S: "xyz"}, {Kind: "f64", F: 1.5}}})
	for n := range len(full) {
		var v Value
		err := msgpack.Unmarshal(full[:n], &v)
		if !errors.Is(err, ErrDecode) {
			t.Errorf("%d bytes: %v", n, err)
		}
	}
	// A 4 GiB string header with nothing behind it.
	var v Value
	if err := msgpack.Unmarshal([]byte{0xdb, 0xff, 0xff, 0xff, 0xff, 'x'}, &v); !errors.Is(err, ErrDecode) {
		t.Errorf("huge string: %v", err)
	}
	if err := msgpack.Unmarshal([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}, &v); !errors.Is(err, ErrDecode) {
		t.Errorf("huge array: %v", err)
	}
	if err := msgpack.Unmarshal([]byte{0xc1}, &v); !errors.Is(err, ErrDecode) {
		t.Errorf("0xc1: %v", err)
	}
}

// A value written by a MessagePack client, stored, and read by a JSON
// client and a MessagePack client through whole frames.
func TestValueAcrossCodecs(t *testing.T) {
	in := node{Kind: "map", Keys: []string{"z", "f", "h", "u", "s"}, Kids: []node{
		{Kind: "int", I: -5}, {Kind: "f32", F: float64(float32(0.1))}, {Kind: "f64", F: 2},
		{Kind: "uint", U: math.MaxUint64}, {Kind: "str", S: "é\n"}}}
	reqs, err := Msgpack.DecodeRequests(mpFrame(t, "t", "put", "id", 1, "value", msgpackOf(t, in)))
	if err != nil {
		t.Fatal(err)
	}
	stored := reqs[0].Value
	const want = `{"z":-5,"f":0.10000000149011612,"h":2.0,"u":18446744073709551615,"s":"é\n"}`
	if string(stored) != want {
		t.Fatalf("stored %s", stored)
	}
	item := &Snapshot{T: TSnapshot, S: 1, Items: []Item{{Key: "k", Value: stored}}}
	for _, cd := range codecs {
		frame, err := cd.c.Append(nil, item)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := cd.c.DecodeMessages(frame)
		if err != nil {
			t.Fatal(err)
		}
		if got := msgs[0].Items[0].Value; string(got) != want {
			t.Errorf("%s client reads %s", cd.name, got)
		}
	}
	back, _ := stored.MsgpackBytes()
	if diff := diffNodes(in.normal(), nodeOfMsgpack(t, back)); diff != "" {
		t.Error(diff)
	}
	// And a JSON client's value read by a MessagePack client.
	reqs, err = JSON.DecodeRequests([]byte(`{"t":"put","value":{"n":[1, -2, 3.25, "\u00e9"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	frame, _ := Msgpack.Append(nil, &Snapshot{T: TSnapshot, Items: []Item{{Value: reqs[0].Value}}})
	msgs, err := Msgpack.DecodeMessages(frame)
	if err != nil || string(msgs[0].Items[0].Value) != `{"n":[1,-2,3.25,"é"]}` {
		t.Errorf("%v, %v", msgs, err)
	}
}

func TestValueStringEscapes(t *testing.T) {
	// Every byte below 0x80 and a few runes, as msgpack strings, give
	// JSON that reads back to the same string, and the same text as the
	// JSON side would store.
	var sb strings.Builder
	for c := range 0x80 {
		sb.WriteByte(byte(c))
	}
	sb.WriteString("é\u2028\uFFFD😀")
	s := sb.String()
	var v Value
	if err := msgpack.Unmarshal(msgpackOf(t, node{Kind: "str", S: s}), &v); err != nil {
		t.Fatal(err)
	}
	var back string
	if err := json.Unmarshal(v, &back); err != nil || back != s {
		t.Errorf("%s: %q, %v", v, back, err)
	}
	quoted, _ := json.Marshal(s)
	if canon, err := ValueFromJSON(quoted); err != nil || !bytes.Equal(canon, v) {
		t.Errorf("JSON side stores %s, msgpack side %s", canon, v)
	}
}
