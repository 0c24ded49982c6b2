package wire

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"pgregory.net/rapid"
)

var specialFloats = []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 1e21, 1e-7, 123456, 5e-324,
	math.MaxFloat64, -math.MaxFloat64, math.SmallestNonzeroFloat64, 9007199254740993, 1 << 63, 1 << 64}

func genString() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.String(),
		rapid.StringMatching(`[a-z"\\/\n\t\x00\x1f\x7f<>&é€😀\x{2028}]{0,12}`),
		rapid.SampledFrom([]string{"", "\"", "\\", "\uFFFD", "\U0010FFFF"}),
	).Filter(utf8.ValidString)
}

// genNode generates MessagePack values that have a JSON equivalent,
// nesting at most depth levels.
func genNode(depth int) *rapid.Generator[node] {
	return rapid.Custom(func(t *rapid.T) node {
		kinds := []string{"nil", "bool", "int", "uint", "f32", "f64", "str"}
		if depth > 0 {
			kinds = append(kinds, "arr", "map")
		}
		switch k := rapid.SampledFrom(kinds).Draw(t, "kind"); k {
		case "nil":
			return node{Kind: k}
		case "bool":
			return node{Kind: k, B: rapid.Bool().Draw(t, "b")}
		case "int":
			return node{Kind: k, I: rapid.Int64().Draw(t, "i")}
		case "uint":
			return node{Kind: k, U: rapid.Uint64().Draw(t, "u")}
		case "f32":
			f := rapid.Float32Range(-math.MaxFloat32, math.MaxFloat32).Draw(t, "f32")
			return node{Kind: k, F: float64(f)}
		case "f64":
			f := rapid.OneOf(rapid.Float64(), rapid.SampledFrom(specialFloats)).Draw(t, "f64")
			return node{Kind: k, F: f}
		case "str":
			return node{Kind: k, S: genString().Draw(t, "s")}
		case "arr":
			kids := rapid.SliceOfN(genNode(depth-1), 0, 4).Draw(t, "kids")
			return node{Kind: k, Kids: append([]node{}, kids...)}
		default:
			n := rapid.IntRange(0, 4).Draw(t, "n")
			out := node{Kind: k, Keys: []string{}, Kids: []node{}}
			for range n {
				out.Keys = append(out.Keys, genString().Draw(t, "key"))
				out.Kids = append(out.Kids, genNode(depth-1).Draw(t, "kid"))
			}
			return out
		}
	})
}

// MessagePack → Value → MessagePack gives the same value (float32 as
// float64), and JSON and MessagePack clients read the same text.
func TestPropertyMsgpackRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := genNode(4).Draw(t, "value")
		raw := msgpackOf(t, n)
		reqs, err := Msgpack.DecodeRequests(mpFrame(t, "t", "put", "id", 1, "value", raw))
		if err != nil {
			t.Fatalf("%x: %v", raw, err)
		}
		v := reqs[0].Value
		if !json.Valid(v) {
			t.Fatalf("invalid JSON %s", v)
		}
		if c, err := ValueFromJSON(v); err != nil || string(c) != string(v) {
			t.Fatalf("not canonical: %s vs %s, %v", v, c, err)
		}
		back, err := v.MsgpackBytes()
		if err != nil {
			t.Fatal(err)
		}
		if diff := diffNodes(n.normal(), nodeOfMsgpack(t, back)); diff != "" {
			t.Fatalf("%s: %s", v, diff)
		}
		for _, cd := range codecs {
			frame, err := cd.c.Append(nil, &Snapshot{T: TSnapshot, Items: []Item{{Key: "k", Value: v}}})
			if err != nil {
				t.Fatal(err)
			}
			msgs, err := cd.c.DecodeMessages(frame)
			if err != nil || string(msgs[0].Items[0].Value) != string(v) {
				t.Fatalf("%s client: %v, %v", cd.name, msgs, err)
			}
		}
	})
}

// renderJSON writes n as JSON in a randomly chosen style: whitespace,
// escapes and number spellings vary. plain reports whether every number
// was written as a canonical integer.
func renderJSON(t *rapid.T, n node) (text string, plain bool) {
	var b strings.Builder
	plain = true
	ws := func() { b.WriteString(rapid.SampledFrom([]string{"", "", " ", "\n\t", "\r\n "}).Draw(t, "ws")) }
	var str func(s string) //lint:ignore S1021 declared first: it calls itself
	str = func(s string) {
		b.WriteByte('"')
		for _, r := range s {
			style := rapid.IntRange(0, 3).Draw(t, "esc")
			switch {
			case style == 0 && r >= 0x20 && r != '"' && r != '\\':
				b.WriteRune(r)
			case style == 1 && strings.ContainsRune("\"\\/\b\f\n\r\t", r):
				b.WriteString(map[rune]string{'"': `\"`, '\\': `\\`, '/': `\/`, '\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`}[r])
			case r > 0xffff:
				r -= 0x10000
				fmt.Fprintf(&b, `\u%04X\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			default:
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		}
		b.WriteByte('"')
	}
	var walk func(n node)
	walk = func(n node) {
		ws()
		switch n.Kind {
		case "nil":
			b.WriteString("null")
		case "bool":
			b.WriteString(strconv.FormatBool(n.B))
		case "int":
			if n.I == 0 && rapid.Bool().Draw(t, "-0") {
				b.WriteString("-0")
				plain = false
			} else {
				b.WriteString(strconv.FormatInt(n.I, 10))
			}
		case "uint":
			b.WriteString(strconv.FormatUint(n.U, 10))
		case "f32", "f64":
			f := rapid.SampledFrom([]byte("geEf")).Draw(t, "fmt")
			s := strconv.FormatFloat(n.F, f, -1, 64)
			if strings.Contains(s, ".") && rapid.Bool().Draw(t, "zeros") {
				i := strings.IndexAny(s, "eE")
				if i < 0 {
					i = len(s)
				}
				s = s[:i] + "00" + s[i:]
			}
			b.WriteString(s)
			plain = false
		case "str":
			str(n.S)
		case "arr":
			b.WriteByte('[')
			for i, k := range n.Kids {
				if i > 0 {
					ws()
					b.WriteByte(',')
				}
				walk(k)
			}
			ws()
			b.WriteByte(']')
		case "map":
			b.WriteByte('{')
			for i, k := range n.Kids {
				if i > 0 {
					b.WriteByte(',')
				}
				ws()
				str(n.Keys[i])
				ws()
				b.WriteByte(':')
				walk(k)
			}
			ws()
			b.WriteByte('}')
		}
		ws()
	}
	walk(n)
	return b.String(), plain
}

// JSON → Value keeps the meaning and number text; Value → MessagePack →
// Value keeps the text except for non-integer numbers (equal as float64)
// and "-0"; a second trip changes nothing.
func TestPropertyJSONRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		text, plain := renderJSON(t, genNode(4).Draw(t, "value"))
		v, err := ValueFromJSON([]byte(text))
		if err != nil {
			t.Fatalf("%s: %v", text, err)
		}
		if !json.Valid(v) {
			t.Fatalf("invalid %s", v)
		}
		if diff := diffNodes(nodeOfJSON(t, []byte(text)), nodeOfJSON(t, v)); diff != "" {
			t.Fatalf("%s → %s: %s", text, v, diff)
		}
		w := viaMsgpack(t, v)
		if diff := diffNodes(nodeOfJSON(t, v), nodeOfJSON(t, w)); diff != "" {
			t.Fatalf("%s → %s: %s", v, w, diff)
		}
		if plain && string(w) != string(v) {
			t.Fatalf("%s → %s", v, w)
		}
		if again := viaMsgpack(t, w); string(again) != string(w) {
			t.Fatalf("%s → %s", w, again)
		}
	})
}
