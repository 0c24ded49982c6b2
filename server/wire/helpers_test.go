package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// tb is what the helpers need of *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// node is a value tree in the terms both codecs share, used to compare
// values semantically: ints by value whatever their width, floats by bits,
// maps as ordered pairs.
type node struct {
	Kind string // nil bool int uint f32 f64 str arr map
	B    bool
	I    int64
	U    uint64
	F    float64
	S    string
	Keys []string
	Kids []node
}

// normal is n as it reads back through a Value: float32 becomes float64,
// integers are "int" when they fit int64.
func (n node) normal() node {
	switch n.Kind {
	case "f32":
		n.Kind = "f64"
	case "uint":
		if n.U <= math.MaxInt64 {
			n = node{Kind: "int", I: int64(n.U)}
		}
	}
	kids := make([]node, len(n.Kids))
	for i, k := range n.Kids {
		kids[i] = k.normal()
	}
	if n.Kids != nil {
		n.Kids = kids
	}
	return n
}

// equal compares floats by bits (so -0 differs from 0). cmp.Diff is not
// used on nodes: its slice diffing is exponential in nesting depth.
func (n node) equal(o node) bool {
	if n.Kind != o.Kind || n.B != o.B || n.I != o.I || n.U != o.U || n.S != o.S ||
		math.Float64bits(n.F) != math.Float64bits(o.F) || len(n.Kids) != len(o.Kids) || !slices.Equal(n.Keys, o.Keys) {
		return false
	}
	for i := range n.Kids {
		if !n.Kids[i].equal(o.Kids[i]) {
			return false
		}
	}
	return true
}

func diffNodes(want, got node) string {
	if want.equal(got) {
		return ""
	}
	return fmt.Sprintf("want %+v\n got %+v", want, got)
}

func encodeNode(e *msgpack.Encoder, n node) error {
	switch n.Kind {
	case "nil":
		return e.EncodeNil()
	case "bool":
		return e.EncodeBool(n.B)
	case "int":
		return e.EncodeInt(n.I)
	case "uint":
		return e.EncodeUint(n.U)
	case "f32":
		return e.EncodeFloat32(float32(n.F))
	case "f64":
		return e.EncodeFloat64(n.F)
	case "str":
		return e.EncodeString(n.S)
	case "arr":
		if err := e.EncodeArrayLen(len(n.Kids)); err != nil {
			return err
		}
		for _, k := range n.Kids {
			if err := encodeNode(e, k); err != nil {
				return err
			}
		}
		return nil
	case "map":
		if err := e.EncodeMapLen(len(n.Kids)); err != nil {
			return err
		}
		for i, k := range n.Kids {
			if err := e.EncodeString(n.Keys[i]); err != nil {
				return err
			}
			if err := encodeNode(e, k); err != nil {
				return err
			}
		}
		return nil
	}
	panic("bad node kind " + n.Kind)
}

func msgpackOf(t tb, n node) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := encodeNode(msgpack.NewEncoder(&buf), n); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// decodeNode reads one msgpack value as a node, normalized.
func decodeNode(d *msgpack.Decoder) (node, error) {
	c, err := d.PeekCode()
	if err != nil {
		return node{}, err
	}
	switch {
	case c == msgpcode.Nil:
		return node{Kind: "nil"}, d.DecodeNil()
	case c == msgpcode.True || c == msgpcode.False:
		b, err := d.DecodeBool()
		return node{Kind: "bool", B: b}, err
	case c == msgpcode.Float:
		f, err := d.DecodeFloat32()
		return node{Kind: "f32", F: float64(f)}, err
	case c == msgpcode.Double:
		f, err := d.DecodeFloat64()
		return node{Kind: "f64", F: f}, err
	case c <= msgpcode.PosFixedNumHigh || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64):
		u, err := d.DecodeUint64()
		return node{Kind: "uint", U: u}.normal(), err
	case c >= msgpcode.NegFixedNumLow || (c >= msgpcode.Int8 && c <= msgpcode.Int64):
		i, err := d.DecodeInt64()
		return node{Kind: "int", I: i}, err
	case msgpcode.IsString(c):
		s, err := d.DecodeString()
		return node{Kind: "str", S: s}, err
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return node{}, err
		}
		out := node{Kind: "arr", Kids: []node{}}
		for range n {
			k, err := decodeNode(d)
			if err != nil {
				return node{}, err
			}
			out.Kids = append(out.Kids, k)
		}
		return out, nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return node{}, err
		}
		out := node{Kind: "map", Keys: []string{}, Kids: []node{}}
		for range n {
			key, err := d.DecodeString()
			if err != nil {
				return node{}, err
			}
			k, err := decodeNode(d)
			if err != nil {
				return node{}, err
			}
			out.Keys = append(out.Keys, key)
			out.Kids = append(out.Kids, k)
		}
		return out, nil
	}
	return node{}, errors.New("unexpected code")
}

func nodeOfMsgpack(t tb, b []byte) node {
	t.Helper()
	d := msgpack.NewDecoder(bytes.NewReader(b))
	n, err := decodeNode(d)
	if err != nil {
		t.Fatalf("decode %x: %v", b, err)
	}
	return n
}

// nodeOfJSON reads JSON text as a node, numbers read as MessagePack
// reads them.
func nodeOfJSON(t tb, b []byte) node {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var read func() node
	read = func() node {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("JSON %q: %v", b, err)
		}
		switch v := tok.(type) {
		case nil:
			return node{Kind: "nil"}
		case bool:
			return node{Kind: "bool", B: v}
		case string:
			return node{Kind: "str", S: v}
		case json.Number:
			n, err := parseNumber(string(v))
			if err != nil {
				t.Fatal(err)
			}
			switch n.kind {
			case 'i':
				return node{Kind: "int", I: n.i}
			case 'u':
				return node{Kind: "uint", U: n.u}
			}
			return node{Kind: "f64", F: n.f}
		case json.Delim:
			if v == '[' {
				out := node{Kind: "arr", Kids: []node{}}
				for dec.More() {
					out.Kids = append(out.Kids, read())
				}
				dec.Token()
				return out
			}
			out := node{Kind: "map", Keys: []string{}, Kids: []node{}}
			for dec.More() {
				k := read()
				out.Keys = append(out.Keys, k.S)
				out.Kids = append(out.Kids, read())
			}
			dec.Token()
			return out
		}
		t.Fatalf("token %v", tok)
		return node{}
	}
	n := read()
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("JSON %q: trailing data", b)
	}
	return n
}

// nested returns depth nested arrays around inner, as JSON.
func nestedJSON(depth int, inner string) string {
	return strings.Repeat("[", depth) + inner + strings.Repeat("]", depth)
}

// nestedMsgpack returns depth nested one-element arrays around nil.
func nestedMsgpack(depth int) []byte {
	return append(bytes.Repeat([]byte{0x91}, depth), 0xc0)
}

// mpFrame builds a msgpack map from alternating keys and values; a
// value of type []byte is copied raw.
func mpFrame(t tb, kv ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	if err := e.EncodeMapLen(len(kv) / 2); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(kv); i += 2 {
		e.EncodeString(kv[i].(string))
		if raw, ok := kv[i+1].([]byte); ok {
			buf.Write(raw)
			continue
		}
		if err := e.Encode(kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}
