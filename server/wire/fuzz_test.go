package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"
)

// seedFrames are valid frames of codec c and a few broken ones.
func seedFrames(t tb, c Codec) [][]byte {
	var seeds [][]byte
	var all []byte
	for _, r := range clientRequests() {
		b, err := c.Append(nil, &r)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b)
		all, _ = c.Append(all, &r)
	}
	seeds = append(seeds, all, all[:len(all)/2], all[len(all)/3:])
	return seeds
}

// checkDecode is what both request fuzzers assert of one frame: no panic,
// only the documented errors, valid canonical values, and requests that
// survive encoding again.
func checkDecode(t *testing.T, c Codec, frame []byte) {
	reqs, err := c.DecodeRequests(frame)
	var ve *ValueError
	if err != nil && !errors.As(err, &ve) {
		if !errors.Is(err, ErrDecode) || reqs != nil {
			t.Fatalf("%q: %v, %v", frame, reqs, err)
		}
		return
	}
	for i, r := range reqs {
		if ve.At(i) != nil {
			if !(errors.Is(ve.At(i), ErrInvalidValue) || errors.Is(ve.At(i), ErrInvalidKey)) || r.Value != nil {
				t.Fatalf("%q: request %d: %+v, %v", frame, i, r, ve.At(i))
			}
			continue
		}
		values := []Value{r.Value}
		for _, op := range r.Ops {
			values = append(values, op.Value)
		}
		// Nothing is silently rewritten: every string decoded is valid
		// UTF-8, and holds U+FFFD only if the frame did.
		strs := requestStrings(r)
		for _, v := range values {
			strs = append(strs, string(v))
		}
		for _, str := range strs {
			if !utf8.ValidString(str) || (strings.ContainsRune(str, utf8.RuneError) && !hasReplacementChar(frame)) {
				t.Fatalf("%q: request %d: string %q was rewritten or is not UTF-8", frame, i, str)
			}
		}
		for _, v := range values {
			if v == nil {
				continue
			}
			if c, err := ValueFromJSON(v); err != nil || !bytes.Equal(c, v) {
				t.Fatalf("%q: value %q not canonical JSON: %v", frame, v, err)
			}
		}
		out, err := c.Append(nil, &r)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		back, err := c.DecodeRequests(out)
		if err != nil {
			t.Fatalf("%q: %v", out, err)
		}
		if diff := cmp.Diff([]Request{r}, back, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%q: %s", out, diff)
		}
	}
}

// requestStrings returns every string field of r.
func requestStrings(r Request) []string {
	strs := append([]string{r.T, r.Token, r.Session, r.Resume, r.Room, r.Key, r.Lease}, r.Prefixes...)
	if r.From != nil {
		strs = append(strs, r.From.Epoch)
	}
	for _, c := range r.If {
		strs = append(strs, c.Key)
	}
	for _, op := range r.Ops {
		strs = append(strs, op.Type, op.Op, op.Key, op.Lease)
	}
	return strs
}

// hasReplacementChar reports whether frame holds U+FFFD, literally or as
// a JSON escape.
func hasReplacementChar(frame []byte) bool {
	return bytes.Contains(frame, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(frame), []byte(`\ufffd`))
}

func fuzzDecode(f *testing.F, c Codec, extra ...[]byte) {
	for _, s := range append(seedFrames(f, c), extra...) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		checkDecode(t, c, frame)
		h := len(frame) / 2
		checkDecode(t, c, frame[:h])
		checkDecode(t, c, frame[h:])
	})
}

func FuzzDecodeRequestsJSON(f *testing.F) {
	fuzzDecode(f, JSON,
		[]byte(" {\"t\":\"ping\"} \r\n\n{\"t\":\"put\",\"value\":[1,{\"a\":\"\\u0041\"}]}"),
		[]byte(`{"t":"put","id":5,"value":`+nestedJSON(70, "")+`}`),
		[]byte(`{"t":"put","id":5,"value":1e400}`),
		[]byte(`{"t":"put","id":"x","value":1e400}`),
		[]byte("{\"t\":\"put\",\"value\":\"\xff\"}"),
		[]byte("{\"t\":\"put\",\"id\":1,\"key\":\"\xff\"}\n{\"t\":\"put\",\"id\":2,\"key\":\"\xfe\"}"),
		[]byte(`{"t":"put","id":1,"key":"\ud800","value":"\udc00"}`),
		[]byte(`{"t":"txn","id":1,"if":[{"key":"\uDBFF"}],"ops":[{"op":"put","key":"\ufffd","value":"\ud83d\ude00"}]}`),
		[]byte(`{"T":"PUT","ID":1,"if_rev":null,"prefixes":["a",null],"from":{}}`),
		[]byte(`[1]`), []byte(`null`), []byte(""), []byte("{"))
}

func FuzzDecodeRequestsMsgpack(f *testing.F) {
	put := func(v []byte) []byte { return mpFrame(f, "t", "put", "id", 5, "value", v) }
	fuzzDecode(f, Msgpack,
		put([]byte{0xc4, 1, 0}), put([]byte{0xd6, 0xff, 0, 0, 0, 1}), put([]byte{0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 1}),
		put([]byte{0x81, 0x01, 0xc0}), put(nestedMsgpack(70)), put([]byte{0xa1, 0xff}), put([]byte{0xca, 0x3d, 0xcc, 0xcc, 0xcd}),
		mpFrame(f, "t", "sub", "from", []any{"e", 5}, "prefixes", []any{"a", nil}, "id", -1),
		mpFrame(f, "t", "ping", "x", nestedMsgpack(200)),
		mpFrame(f, "t", "put", "id", 1, "key", "\xff", "room", "r", "value", 1), mpFrame(f, "t", "sub", "id", 2, "prefixes", []string{"\xfe"}),
		[]byte{0xdf, 0xff, 0xff, 0xff, 0xff}, []byte{0xc1}, []byte{0x91, 0x80}, nil)
}

// FuzzValueRoundTrip reads its input as JSON and as MessagePack; whatever
// is accepted must survive trips through the other codec.
func FuzzValueRoundTrip(f *testing.F) {
	for _, s := range []string{richValue, `1.50`, `-0`, `1e-400`, `18446744073709551616`, `"\ud800"`, `{"a":1,"a":[]}`,
		nestedJSON(64, "1"), nestedJSON(65, "1"), `1e400`, "\"\xff\"", ` [ 1 , 2 ] `} {
		f.Add([]byte(s))
	}
	for _, n := range []node{{Kind: "f32", F: 0.1}, {Kind: "f64", F: 1}, {Kind: "uint", U: 1<<64 - 1},
		{Kind: "map", Keys: []string{"b", "a"}, Kids: []node{{Kind: "nil"}, {Kind: "str", S: "\x00é"}}}} {
		f.Add(msgpackOf(f, n))
	}
	f.Add([]byte{0xc4, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		sentinel := func(err error) {
			if !errors.Is(err, ErrDecode) && !errors.Is(err, ErrInvalidValue) {
				t.Fatalf("%q: %v", data, err)
			}
		}
		if v, err := ValueFromJSON(data); err != nil {
			sentinel(err)
		} else {
			if c, err := ValueFromJSON(v); err != nil || !bytes.Equal(c, v) {
				t.Fatalf("%q → %s → %s, %v", data, v, c, err)
			}
			// The same meaning as encoding/json reads, in both forms.
			if diff := diffNodes(nodeOfJSON(t, data), nodeOfJSON(t, v)); diff != "" {
				t.Fatalf("%q → %s: %s", data, v, diff)
			}
			b, err := v.MsgpackBytes()
			if err != nil {
				t.Fatal(err)
			}
			if diff := diffNodes(nodeOfJSON(t, v).normal(), nodeOfMsgpack(t, b)); diff != "" {
				t.Fatalf("%s → %x: %s", v, b, diff)
			}
			w := viaMsgpack(t, v)
			if diff := diffNodes(nodeOfJSON(t, v), nodeOfJSON(t, w)); diff != "" {
				t.Fatalf("%s → %s: %s", v, w, diff)
			}
			if again := viaMsgpack(t, w); !bytes.Equal(again, w) {
				t.Fatalf("%s → %s", w, again)
			}
		}
		var v Value
		d := msgpack.NewDecoder(bytes.NewReader(data))
		if err := d.Decode(&v); err != nil {
			sentinel(err)
			return
		}
		if !json.Valid(v) {
			t.Fatalf("%x → invalid %q", data, v)
		}
		if c, err := ValueFromJSON(v); err != nil || !bytes.Equal(c, v) {
			t.Fatalf("%x → %s not canonical: %v", data, v, err)
		}
		back, err := v.MsgpackBytes()
		if err != nil {
			t.Fatal(err)
		}
		if diff := diffNodes(nodeOfMsgpack(t, data).normal(), nodeOfMsgpack(t, back)); diff != "" {
			t.Fatalf("%x → %s → %x: %s", data, v, back, diff)
		}
	})
}

// FuzzDenseEvents: the fast path of a v2 events message (denseEvents)
// decodes exactly what json.Unmarshal's path does, or leaves the message
// to it; the seeds are the server's own messages and near misses.
func FuzzDenseEvents(f *testing.F) {
	for _, seed := range []string{
		`{"t":"events","s":1,"r":7,"e":[["k",{"a":1},3,2],["j",{"x":1}],["d"],["p",1,1,1,{"m":5,"l":1,"w":"c-1","p":[0,1,4,1,1]}]]}`,
		`{"t":"coalesced","s":2,"r":9,"e":[]}`,
		` { "e" : [ ["k","v",1,1] ] , "r" : 3 , "s" : 1 , "t" : "events" } `,
		`{"t":"events","s":1,"r":7,"e":[["k",{"a":1},3,2]],"t":"ok"}`,
		`{"t":"ok","t":"events","s":1,"r":7,"e":[]}`,
		`{"T":"events","s":1,"r":7,"e":[]}`, `{"t":"events","s":1,"R":7,"e":[]}`,
		`{"t":"events","s":-1,"r":7,"e":[]}`, `{"t":"events","s":1.5,"r":7,"e":[]}`, `{"t":"events","s":1,"r":1e2,"e":[]}`,
		`{"t":"events","s":1,"r":18446744073709551616,"e":[]}`, `{"t":"events","s":null,"r":7,"e":[]}`,
		`{"t":"events","s":1,"r":7,"e":null}`, `{"t":"events","s":1,"r":7}`, `{"t":"events","s":1,"r":7,"e":{}}`,
		`{"t":"\u0065vents","s":1,"r":7,"e":[]}`, `{"\u0074":"events","s":1,"r":7,"e":[]}`,
		`{"t":"events","s":1,"r":7,"e":[["k"],]}`, `{"t":"events","s":1,"r":7,"e":[[1,2,3,4]]}`,
		`{"t":"events","s":1,"r":7,"e":[["k",1,2]]}`, `{"t":"events","s":1,"r":7,"e":[["k",1,-2,3]]}`,
		`{"t":"events","id":3,"s":1,"r":7,"e":[]}`, `{"t":"snapshot","s":1,"rev":7,"items":[["k",1,1,1,1]]}`,
		`{}`, `[]`, `{"t":"events"`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		fast, ok, ferr := denseEvents(msg)
		if !ok {
			return
		}
		slow, serr := unmarshalDense(msg)
		if (ferr == nil) != (serr == nil) || ferr != nil && ferr.Error() != serr.Error() {
			t.Fatalf("%q: fast path error %v, json.Unmarshal's %v", msg, ferr, serr)
		}
		if ferr == nil && !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q: fast path %+v, json.Unmarshal's %+v", msg, fast, slow)
		}
	})
}
