package wire

import (
	"bytes"
	"errors"
	"sync"
	"testing"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var codecs = []struct {
	name string
	c    Codec
}{{"json", JSON}, {"msgpack", Msgpack}, {"json2", JSON2}}

func u64(v uint64) *uint64 { return &v }

// A value using every JSON kind, with numbers that survive MessagePack
// textually.
const richValue = `{"name":"Dune","players":2,"f":1.5,"n":null,"a":[true,false,"x\n\"\\\u0001é😀"],` +
	`"max":18446744073709551615,"min":-9223372036854775808,"e":1e+21,"o":{}}`

func testEvents() []Event {
	return []Event{
		{Type: "put", Key: "games/7", Value: Value(richValue), CreateRev: 12, ModRev: 58, Version: 6, Lease: true,
			Prev: &Item{Value: Value(`{"players":2}`), CreateRev: 12, ModRev: 57, Version: 5}},
		{Type: "delete", Key: "games/9", ModRev: 58, Wid: "c1-42"},
		{Type: "put", Key: "k", Value: Value(`null`), CreateRev: 58, ModRev: 58, Version: 1, Wid: "c1-42"},
	}
}

// Every server message, and what a client decodes it to.
func serverMessages() []struct {
	name string
	msg  any
	want Message
} {
	items := []Item{
		{Key: "a", Value: Value(`"Plan"`), CreateRev: 1, ModRev: 3, Version: 2},
		{Key: "b", Value: Value(richValue), CreateRev: 2, ModRev: 2, Version: 1, Lease: true},
	}
	return []struct {
		name string
		msg  any
		want Message
	}{
		{"connected", &Connected{T: TConnected, V: 1, Session: "s_1", Resume: "r_1", Resumed: true, PingMS: 25000, LeaseGraceMS: 5000, ExpiresMS: 3540000},
			Message{T: TConnected, V: 1, Session: "s_1", Resume: "r_1", Resumed: true, PingMS: 25000, LeaseGraceMS: 5000, ExpiresMS: 3540000}},
		{"connected-notoken", Connected{T: TConnected, V: 1, Session: "s_1", Resume: "r_2", PingMS: 25000, LeaseGraceMS: 5000},
			Message{T: TConnected, V: 1, Session: "s_1", Resume: "r_2", PingMS: 25000, LeaseGraceMS: 5000}},
		{"ok", &OK{T: TOK, ID: 2, Rev: 51}, Message{T: TOK, ID: 2, Rev: 51}},
		{"ok-max", &OK{T: TOK, ID: 1<<64 - 1, Rev: 1<<64 - 1}, Message{T: TOK, ID: 1<<64 - 1, Rev: 1<<64 - 1}},
		{"ok-dup", &OK{T: TOK, ID: 2, Rev: 51, Dup: true}, Message{T: TOK, ID: 2, Rev: 51, Dup: true}},
		{"err", &Err{T: TErr, ID: 2, Code: CodeConflict, Message: `condition failed on key "games/7"`, Key: "games/7", ModRev: ptr(uint64(48)), Rev: ptr(uint64(50)), Epoch: "e1"},
			Message{T: TErr, ID: 2, Code: CodeConflict, Message: `condition failed on key "games/7"`, Key: "games/7", ModRev: 48, Rev: 50, Epoch: "e1"}},
		{"synced", &Mark{T: TSynced, S: 1, Rev: 64}, Message{T: TSynced, S: 1, Rev: 64}},
		{"progress", &Mark{T: TProgress, S: 1, Rev: 80}, Message{T: TProgress, S: 1, Rev: 80}},
		{"snapshot", &Snapshot{T: TSnapshot, S: 1, Epoch: "9f2c", Rev: 57, Reason: "initial", Items: items},
			Message{T: TSnapshot, S: 1, Epoch: "9f2c", Rev: 57, Reason: "initial", Items: items}},
		{"snapshot-empty", &Snapshot{T: TSnapshot, S: 3, Epoch: "e", Rev: 9, Reason: "epoch", Items: []Item{}},
			Message{T: TSnapshot, S: 3, Epoch: "e", Rev: 9, Reason: "epoch", Items: []Item{}}},
		{"events", &Message{T: TEvents, S: 1, Rev: 58, Events: testEvents()}, Message{T: TEvents, S: 1, Rev: 58, Events: testEvents()}},
		{"coalesced", &Message{T: TCoalesced, S: 2, Rev: 60, Events: testEvents()[1:]}, Message{T: TCoalesced, S: 2, Rev: 60, Events: testEvents()[1:]}},
		{"unsubscribed", &Unsubscribed{T: TUnsubscribed, S: 1, Code: CodeUnavailable, Message: "room reset"},
			Message{T: TUnsubscribed, S: 1, Code: CodeUnavailable, Message: "room reset"}},
		{"refresh", &Refresh{T: TRefresh, ExpiresMS: 30000}, Message{T: TRefresh, ExpiresMS: 30000}},
		{"pong", &Pong{T: TPong}, Message{T: TPong}},
	}
}

// Every client request.
func clientRequests() []Request {
	return []Request{
		{T: TConnect, Token: "eyJ", Session: "s_2b9f", Resume: "r_77c1"},
		{T: TConnect},
		{T: TAuth, ID: 7, Token: "eyJ"},
		{T: TPing},
		{T: TSub, ID: 1, Room: "lobby:eu", Prefixes: []string{"games/", "presence/"}, From: &Position{Epoch: "9f2c", Rev: 42}, Prev: true},
		{T: TSub, ID: 2, Room: "r", From: &Position{}},
		{T: TUnsub, ID: 9, Sub: 1},
		{T: TPut, ID: 2, Room: "lobby:eu", Key: "games/7", Value: Value(richValue), IfRev: u64(57), Lease: "session"},
		{T: TPut, ID: 3, Room: "r", Key: "k", Value: Value(`null`), IfRev: u64(0)},
		{T: TDel, ID: 3, Room: "lobby:eu", Key: "games/9", IfRev: u64(12), Wid: "c1-43", Since: u64(0)},
		{T: TTxn, ID: 4, Room: "doc:42", If: []Cond{{Key: "title", ModRev: 7}, {Key: "new", ModRev: 0}},
			Ops: []TxnOp{{Type: "put", Key: "title", Value: Value(`"Plan"`), Lease: "l_1"}, {Type: "delete", Key: "items/3"}},
			Wid: "c1-44", Since: u64(41)},
		{T: TTxn, ID: 5, Room: "r", Ops: []TxnOp{{Op: "put", Key: "k", Value: Value(`1`)}, {Op: "del", Key: "j"}}}, // the older spelling
	}
}

func TestSubprotocols(t *testing.T) {
	for _, tc := range []struct {
		name string
		want Codec
		ok   bool
	}{{"", JSON, true}, {"statecast.v1.json", JSON, true}, {"statecast.v1.msgpack", Msgpack, true},
		{"statecast.v2.json", JSON2, true}, {"statecast.v2.msgpack", nil, false}, {"statecast.v3.json", nil, false}} {
		if c, ok := ForSubprotocol(tc.name); c != tc.want || ok != tc.ok {
			t.Errorf("ForSubprotocol(%q) = %v, %v", tc.name, c, ok)
		}
	}
	if JSON.Subprotocol() != "statecast.v1.json" || JSON.MessageType() != websocket.MessageText {
		t.Error("JSON codec identity")
	}
	if Msgpack.Subprotocol() != "statecast.v1.msgpack" || Msgpack.MessageType() != websocket.MessageBinary {
		t.Error("msgpack codec identity")
	}
	if JSON2.Subprotocol() != "statecast.v2.json" || JSON2.MessageType() != websocket.MessageText ||
		JSON2.Version() != 2 || JSON.Version() != 1 || Msgpack.Version() != 1 {
		t.Error("v2 JSON codec identity")
	}
}

func TestServerMessages(t *testing.T) {
	for _, cd := range codecs {
		for _, tc := range serverMessages() {
			t.Run(cd.name+"/"+tc.name, func(t *testing.T) {
				frame, err := cd.c.Append(nil, tc.msg)
				if err != nil {
					t.Fatal(err)
				}
				got, err := cd.c.DecodeMessages(frame)
				if err != nil {
					t.Fatalf("%q: %v", frame, err)
				}
				if diff := cmp.Diff([]Message{tc.want}, got); diff != "" {
					t.Errorf("%q (-want +got):\n%s", frame, diff)
				}
			})
		}
	}
}

func TestClientRequests(t *testing.T) {
	for _, cd := range codecs {
		for _, req := range clientRequests() {
			t.Run(cd.name+"/"+req.T, func(t *testing.T) {
				frame, err := cd.c.Append(nil, &req)
				if err != nil {
					t.Fatal(err)
				}
				got, err := cd.c.DecodeRequests(frame)
				if err != nil {
					t.Fatalf("%q: %v", frame, err)
				}
				if diff := cmp.Diff([]Request{req}, got); diff != "" {
					t.Errorf("%q (-want +got):\n%s", frame, diff)
				}
			})
		}
	}
}

// The exact encodings: compact JSON with the tag names, and compact
// msgpack maps keyed by them.
func TestExactEncoding(t *testing.T) {
	for _, tc := range []struct {
		msg       any
		json      string
		msgpackHx []byte
	}{
		{&OK{T: TOK, ID: 2, Rev: 51}, `{"t":"ok","id":2,"rev":51}`,
			[]byte("\x83\xa1t\xa2ok\xa2id\x02\xa3rev\x33")},
		{&OK{T: TOK, ID: 300}, `{"t":"ok","id":300}`,
			[]byte("\x82\xa1t\xa2ok\xa2id\xcd\x01\x2c")},
		{&Request{T: TPut, ID: 1, Key: "<&>", Value: Value(`{"a":"<b>"}`), IfRev: u64(0)},
			`{"t":"put","id":1,"key":"<&>","value":{"a":"<b>"},"if_rev":0}`,
			[]byte("\x85\xa1t\xa3put\xa2id\x01\xa3key\xa3<&>\xa5value\x81\xa1a\xa3<b>\xa6if_rev\x00")},
		{&OK{T: TOK, ID: 2, Rev: 51, Dup: true}, `{"t":"ok","id":2,"rev":51,"dup":true}`,
			[]byte("\x84\xa1t\xa2ok\xa2id\x02\xa3rev\x33\xa3dup\xc3")},
		{&Event{Type: "delete", Key: "k", ModRev: 9, Wid: "w"}, `{"type":"delete","key":"k","mod_rev":9,"wid":"w"}`,
			[]byte("\x84\xa4type\xa6delete\xa3key\xa1k\xa7mod_rev\x09\xa3wid\xa1w")},
		{&Item{Key: "k"}, `{"key":"k","value":null,"create_rev":0,"mod_rev":0,"version":0}`,
			[]byte("\x85\xa3key\xa1k\xa5value\xc0\xaacreate_rev\x00\xa7mod_rev\x00\xa7version\x00")},
	} {
		got, err := JSON.Append(nil, tc.msg)
		if err != nil || string(got) != tc.json {
			t.Errorf("JSON %T = %s, %v; want %s", tc.msg, got, err, tc.json)
		}
		got, err = Msgpack.Append(nil, tc.msg)
		if err != nil || !bytes.Equal(got, tc.msgpackHx) {
			t.Errorf("msgpack %T = %q, %v; want %q", tc.msg, got, err, tc.msgpackHx)
		}
	}
}

// The examples of PROTOCOL.md decode as documented.
func TestProtocolExamples(t *testing.T) {
	frame := `{"t":"txn","id":4,"room":"doc:42","if":[{"key":"title","mod_rev":7}],` +
		`"ops":[{"type":"put","key":"title","value":"Plan"},{"type":"delete","key":"items/3"}]}` + "\n" +
		`{"t":"sub","id":1,"room":"lobby:eu","prefixes":["games/","presence/"],"from":{"epoch":"9f2c41d07a3b11e8","rev":42},"prev":false}`
	reqs, err := JSON.DecodeRequests([]byte(frame))
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{
		{T: TTxn, ID: 4, Room: "doc:42", If: []Cond{{Key: "title", ModRev: 7}},
			Ops: []TxnOp{{Type: "put", Key: "title", Value: Value(`"Plan"`)}, {Type: "delete", Key: "items/3"}}},
		{T: TSub, ID: 1, Room: "lobby:eu", Prefixes: []string{"games/", "presence/"}, From: &Position{Epoch: "9f2c41d07a3b11e8", Rev: 42}},
	}
	if diff := cmp.Diff(want, reqs); diff != "" {
		t.Error(diff)
	}
	_, err = JSON.DecodeMessages([]byte(`{"t":"events","s":1,"rev":58,"events":[
  {"type":"put","key":"games/7","value":{"name":"Dune","players":3,"max":4},"create_rev":12,"mod_rev":58,"version":6,
   "prev":{"value":{"name":"Dune","players":2,"max":4},"create_rev":12,"mod_rev":57,"version":5}},
  {"type":"delete","key":"games/9","mod_rev":58}]}`))
	if err == nil {
		t.Fatal("a pretty-printed message spans lines, so it is not one message")
	}
	msgs, err := JSON.DecodeMessages([]byte(`{"t":"events","s":1,"rev":58,"events":[ {"type":"put","key":"games/7","value":{"name": "Dune", "players":3,"max":4},"create_rev":12,"mod_rev":58,"version":6, "prev":{"value":{"name":"Dune","players":2,"max":4},"create_rev":12,"mod_rev":57,"version":5}}, {"type":"delete","key":"games/9","mod_rev":58}]}`))
	if err != nil {
		t.Fatal(err)
	}
	wantMsg := []Message{{T: TEvents, S: 1, Rev: 58, Events: []Event{
		{Type: "put", Key: "games/7", Value: Value(`{"name":"Dune","players":3,"max":4}`), CreateRev: 12, ModRev: 58, Version: 6,
			Prev: &Item{Value: Value(`{"name":"Dune","players":2,"max":4}`), CreateRev: 12, ModRev: 57, Version: 5}},
		{Type: "delete", Key: "games/9", ModRev: 58}}}}
	if diff := cmp.Diff(wantMsg, msgs); diff != "" {
		t.Error(diff)
	}
}

func TestMultiMessageFrames(t *testing.T) {
	for _, cd := range codecs {
		t.Run(cd.name, func(t *testing.T) {
			var frame []byte
			var want []Message
			for _, tc := range serverMessages() {
				var err error
				if frame, err = cd.c.Append(frame, tc.msg); err != nil {
					t.Fatal(err)
				}
				want = append(want, tc.want)
			}
			list := cd.c.AppendEventList(nil, 99, testEvents())
			frame = cd.c.AppendEvents(frame, TEvents, 4, 99, list)
			want = append(want, Message{T: TEvents, S: 4, Rev: 99, Events: testEvents()})
			got, err := cd.c.DecodeMessages(frame)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Error(diff)
			}

			var reqFrame []byte
			for _, r := range clientRequests() {
				if reqFrame, err = cd.c.Append(reqFrame, r); err != nil {
					t.Fatal(err)
				}
			}
			reqs, err := cd.c.DecodeRequests(reqFrame)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(clientRequests(), reqs); diff != "" {
				t.Error(diff)
			}
		})
	}
}

func TestJSONFrameWhitespace(t *testing.T) {
	frame := " \t{\"t\":\"ping\"}\r\n\n  {\"t\" : \"put\", \"id\":1, \"value\" : [ 1 , {\"a\" : \"\\u0041\" } ] }  \r\n"
	got, err := JSON.DecodeRequests([]byte(frame))
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{{T: TPing}, {T: TPut, ID: 1, Value: Value(`[1,{"a":"A"}]`)}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Error(diff)
	}
}

func TestAppendEventsMatchesAppend(t *testing.T) {
	for _, cd := range codecs {
		for _, evs := range [][]Event{testEvents(), testEvents()[1:2], nil} {
			list := cd.c.AppendEventList(nil, 1<<40, evs)
			spliced := cd.c.AppendEvents([]byte{}, TCoalesced, 7, 1<<40, list)
			whole, err := cd.c.Append(nil, &Message{T: TCoalesced, S: 7, Rev: 1 << 40, Events: evs})
			if err != nil {
				t.Fatal(err)
			}
			a, err := cd.c.DecodeMessages(spliced)
			if err != nil {
				t.Fatalf("%s: %q: %v", cd.name, spliced, err)
			}
			b, err := cd.c.DecodeMessages(whole)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(b, a, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s: (-Append +AppendEvents)\n%s", cd.name, diff)
			}
			if len(evs) > 0 && !bytes.Equal(spliced, whole) {
				t.Errorf("%s: AppendEvents %q, Append %q", cd.name, spliced, whole)
			}
			// After other messages, with the separator.
			frame, _ := cd.c.Append(nil, &Pong{T: TPong})
			frame = cd.c.AppendEvents(frame, TEvents, 1, 2, list)
			if msgs, err := cd.c.DecodeMessages(frame); err != nil || len(msgs) != 2 {
				t.Errorf("%s: %q: %v, %d messages", cd.name, frame, err, len(msgs))
			}
		}
	}
}

// TestEventsPartsMatchAppendEvents: head, list and tail, the pieces a
// large list is sent in, are byte for byte AppendEvents's message, alone
// and after another message of the frame.
func TestEventsPartsMatchAppendEvents(t *testing.T) {
	for _, cd := range codecs {
		list := cd.c.AppendEventList(nil, 1<<40, testEvents())
		for _, before := range [][]byte{nil, mustAppend(t, cd.c, &Pong{T: TPong})} {
			want := cd.c.AppendEvents(bytes.Clone(before), TEvents, 7, 1<<40, list)
			got := cd.c.AppendEventsHead(bytes.Clone(before), TEvents, 7, 1<<40)
			got = append(append(got, list...), cd.c.EventsTail()...)
			if !bytes.Equal(got, want) {
				t.Errorf("%s: head+list+tail %q, AppendEvents %q", cd.name, got, want)
			}
		}
	}
}

func mustAppend(t *testing.T, c Codec, msg any) []byte {
	t.Helper()
	b, err := c.Append(nil, msg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAppendKeepsBufferOnError(t *testing.T) {
	for _, cd := range codecs {
		buf, _ := cd.c.Append(nil, &Pong{T: TPong})
		n := len(buf)
		out, err := cd.c.Append(buf, &Request{T: TPut, Value: Value(`{"a":`)})
		if !errors.Is(err, ErrInvalidValue) || len(out) != n {
			t.Errorf("%s: invalid value: %v, %d bytes (had %d)", cd.name, err, len(out), n)
		}
		out, err = cd.c.Append(buf, make(chan int))
		if err == nil || len(out) != n {
			t.Errorf("%s: channel: %v", cd.name, err)
		}
		if cd.c.MessageType() == websocket.MessageText {
			continue // the JSON codecs write values as they are (and faster): they come from this package
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: AppendEventList of an invalid value did not panic", cd.name)
				}
			}()
			cd.c.AppendEventList(nil, 0, []Event{{Type: "put", Value: Value("nope")}})
		}()
	}
}

// Absent and null values stay distinct in both codecs.
func TestNullValue(t *testing.T) {
	for _, cd := range codecs {
		frame, _ := cd.c.Append(nil, &Request{T: TPut, ID: 1})
		frame, _ = cd.c.Append(frame, &Request{T: TPut, ID: 2, Value: Value("null")})
		reqs, err := cd.c.DecodeRequests(frame)
		if err != nil {
			t.Fatal(err)
		}
		if reqs[0].Value != nil || string(reqs[1].Value) != "null" {
			t.Errorf("%s: got %q and %q", cd.name, reqs[0].Value, reqs[1].Value)
		}
	}
	reqs, err := Msgpack.DecodeRequests(mpFrame(t, "t", "put", "value", nil))
	if err != nil || string(reqs[0].Value) != "null" {
		t.Errorf("msgpack nil value: %q, %v", reqs[0].Value, err)
	}
}

func TestUnknownFieldsIgnored(t *testing.T) {
	want := []Request{{T: TPing}}
	got, err := JSON.DecodeRequests([]byte(`{"x":{"y":[1,2,{"z":null,"key":"\ud800"}]},"t":"ping","zz":"\u0000","w":"\udc00","\ud800":1}`))
	if err != nil || !cmp.Equal(want, got) {
		t.Errorf("JSON: %v, %v", got, err)
	}
	// Unknown fields may hold anything, even types values reject.
	got, err = Msgpack.DecodeRequests(mpFrame(t, "x", []byte{0xc4, 1, 0xff}, "t", "ping", "y", []byte{0xd4, 1, 2},
		"z", map[string]any{"a": []any{1, 2.5}}, "deep", nestedMsgpack(500)))
	if err != nil || !cmp.Equal(want, got) {
		t.Errorf("msgpack: %v, %v", got, err)
	}
}

// Each rejected frame, with the sentinel its error wraps.
func TestRejections(t *testing.T) {
	put := func(value []byte) []byte { return mpFrame(t, "t", "put", "id", 5, "value", value) }
	deepJSON := `{"t":"put","id":5,"value":` + nestedJSON(1000, "1") + `}`
	valid := mpFrame(t, "t", "ping")
	for _, tc := range []struct {
		name  string
		c     Codec
		frame []byte
		want  error
	}{
		{"json/empty", JSON, nil, ErrDecode},
		{"json/blank", JSON, []byte(" \n\r\n\t"), ErrDecode},
		{"json/garbage", JSON, []byte("hello"), ErrDecode},
		{"json/array", JSON, []byte(`[{"t":"ping"}]`), ErrDecode},
		{"json/null", JSON, []byte(`null`), ErrDecode},
		{"json/string", JSON, []byte(`"ping"`), ErrDecode},
		{"json/trailing", JSON, []byte(`{"t":"ping"} x`), ErrDecode},
		{"json/two-on-a-line", JSON, []byte(`{"t":"ping"}{"t":"ping"}`), ErrDecode},
		{"json/truncated", JSON, []byte(`{"t":"put","id":1,"value":[1,2`), ErrDecode},
		{"json/second-bad", JSON, []byte("{\"t\":\"ping\"}\n{\"t\":"), ErrDecode},
		{"json/id-type", JSON, []byte(`{"t":"put","id":"5"}`), ErrDecode},
		{"json/id-negative", JSON, []byte(`{"t":"put","id":-5}`), ErrDecode},
		{"json/id-fraction", JSON, []byte(`{"t":"put","id":5.5}`), ErrDecode},
		{"json/t-type", JSON, []byte(`{"t":1}`), ErrDecode},
		{"json/prefixes-type", JSON, []byte(`{"t":"sub","prefixes":"a"}`), ErrDecode},
		{"json/depth-20000", JSON, []byte(`{"t":"ping","x":` + nestedJSON(20000, "") + `}`), ErrDecode},
		{"json/value-depth-1000", JSON, []byte(deepJSON), ErrInvalidValue},
		{"json/value-depth-65", JSON, []byte(`{"t":"put","id":5,"value":` + nestedJSON(65, "") + `}`), ErrInvalidValue},
		{"json/value-1e400", JSON, []byte(`{"t":"put","id":5,"value":{"a":1e400}}`), ErrInvalidValue},
		{"json/value-huge-int", JSON, []byte(`{"t":"put","id":5,"value":1` + string(bytes.Repeat([]byte("0"), 400)) + `}`), ErrInvalidValue},
		// A text frame must be UTF-8 as a whole (RFC 6455 §8.1); escaped
		// lone surrogates are rejected by the field holding them.
		{"json/value-utf8", JSON, []byte("{\"t\":\"put\",\"id\":5,\"value\":\"\xff\"}"), ErrDecode},
		{"json/key-utf8", JSON, []byte("{\"t\":\"put\",\"id\":5,\"key\":\"\xff\",\"value\":1}"), ErrDecode},
		{"json/unknown-field-utf8", JSON, []byte("{\"t\":\"ping\",\"x\":\"\xfe\"}"), ErrDecode},
		{"json/value-lone-surrogate", JSON, []byte(`{"t":"put","id":5,"key":"k","value":{"a":"\ud800"}}`), ErrInvalidValue},
		{"json/value-key-lone-surrogate", JSON, []byte(`{"t":"put","id":5,"key":"k","value":{"\udfff":1}}`), ErrInvalidValue},
		{"json/key-lone-surrogate", JSON, []byte(`{"t":"put","id":5,"key":"a\ud800","value":1}`), ErrInvalidKey},
		{"json/key-low-surrogate", JSON, []byte(`{"key":"\uDC00\uD800","t":"del","id":5}`), ErrInvalidKey},
		{"json/prefix-lone-surrogate", JSON, []byte(`{"t":"sub","id":5,"room":"r","prefixes":["a","\ud800"]}`), ErrInvalidKey},
		{"json/cond-key-lone-surrogate", JSON, []byte(`{"t":"txn","id":5,"if":[{"key":"\ud800","mod_rev":1}],"ops":[{"type":"delete","key":"k"}]}`), ErrInvalidKey},
		// encoding/json matches field names case-insensitively, with
		// Unicode folding: every spelling that fills "key" is checked.
		{"json/KEY-lone-surrogate", JSON, []byte(`{"t":"put","id":5,"KEY":"\ud800","value":1}`), ErrInvalidKey},
		{"json/kelvin-key-lone-surrogate", JSON, []byte(`{"t":"put","id":5,"\u212aey":"\ud800","value":1}`), ErrInvalidKey},
		{"json/Prefixes-lone-surrogate", JSON, []byte(`{"t":"sub","id":5,"room":"r","Prefixes":["\udc00"]}`), ErrInvalidKey},
		{"json/Ops-Key-lone-surrogate", JSON, []byte(`{"t":"txn","id":5,"OPS":[{"op":"put","Key":"\ud800","value":1}]}`), ErrInvalidKey},
		{"json/VALUE-lone-surrogate", JSON, []byte(`{"t":"put","id":5,"key":"k","Value":"\ud800"}`), ErrInvalidValue},
		{"json/op-key-lone-surrogate", JSON, []byte(`{"t":"txn","id":5,"ops":[{"type":"delete","key":"k"},{"type":"put","key":"\ud800","value":1}]}`), ErrInvalidKey},
		{"json/op-value-lone-surrogate", JSON, []byte(`{"t":"txn","id":5,"ops":[{"op":"put","key":"k","value":["\ud800"]}]}`), ErrInvalidValue},
		{"json/room-lone-surrogate", JSON, []byte(`{"t":"put","id":5,"room":"\ud800","key":"k","value":1}`), ErrDecode},
		{"json/lease-lone-surrogate", JSON, []byte(`{"t":"put","id":5,"key":"k","value":1,"lease":"\ud800"}`), ErrDecode},
		{"json/t-lone-surrogate", JSON, []byte(`{"t":"\ud800","id":5}`), ErrDecode},
		{"json/filter-lone-surrogate", JSON, []byte(`{"t":"sub","id":5,"room":"r","filter":"value == '\ud800'"}`), ErrDecode},
		{"json/type-lone-surrogate", JSON, []byte(`{"t":"txn","id":5,"ops":[{"type":"\ud800","key":"k"}]}`), ErrDecode},
		{"json/txn-op-value", JSON, []byte(`{"t":"txn","id":5,"ops":[{"type":"put","key":"k","value":-1e999}]}`), ErrInvalidValue},

		{"json/too-many", JSON, bytes.Repeat([]byte("{}\n"), MaxFrameMessages+1), ErrDecode},
		{"msgpack/too-many", Msgpack, bytes.Repeat([]byte{0x80}, MaxFrameMessages+1), ErrDecode},
		{"msgpack/too-many-1MiB", Msgpack, bytes.Repeat([]byte{0x80}, 1<<20), ErrDecode},
		{"msgpack/empty", Msgpack, nil, ErrDecode},
		{"msgpack/garbage", Msgpack, []byte{0xc1}, ErrDecode},
		{"msgpack/array", Msgpack, []byte{0x91, 0x80}, ErrDecode},
		{"msgpack/string", Msgpack, []byte("\xa4ping"), ErrDecode},
		{"msgpack/nil", Msgpack, []byte{0xc0}, ErrDecode},
		{"msgpack/truncated", Msgpack, valid[:len(valid)-1], ErrDecode},
		{"msgpack/truncated-header", Msgpack, []byte{0xdf, 0, 0}, ErrDecode},
		{"msgpack/trailing", Msgpack, append(append([]byte{}, valid...), 0x01), ErrDecode},
		{"msgpack/huge-count", Msgpack, []byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 't'}, ErrDecode},
		{"msgpack/huge-str", Msgpack, []byte{0x81, 0xa1, 't', 0xdb, 0xff, 0xff, 0xff, 0xff, 'x'}, ErrDecode},
		{"msgpack/id-type", Msgpack, mpFrame(t, "t", "put", "id", "5"), ErrDecode},
		{"msgpack/id-fraction", Msgpack, mpFrame(t, "t", "put", "id", 5.5), ErrDecode},
		// A negative int in an unsigned field is refused, as JSON refuses
		// it, not wrapped to 2^64-5.
		{"msgpack/id-negative", Msgpack, mpFrame(t, "t", "put", "id", -5), ErrDecode},
		{"msgpack/id-negative-int64", Msgpack, mpFrame(t, "t", "put", "id", []byte{0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfb}), ErrDecode},
		{"msgpack/sub-negative", Msgpack, mpFrame(t, "t", "unsub", "id", 5, "sub", -1), ErrDecode},
		{"msgpack/if-rev-negative", Msgpack, mpFrame(t, "t", "del", "id", 5, "key", "k", "if_rev", int8(-100)), ErrDecode},
		{"msgpack/since-negative", Msgpack, mpFrame(t, "t", "put", "id", 5, "key", "k", "value", 1, "wid", "w", "since", -1), ErrDecode},
		{"msgpack/from-rev-negative", Msgpack, mpFrame(t, "t", "sub", "id", 5, "from", map[string]any{"epoch": "e", "rev": -7}), ErrDecode},
		{"msgpack/id-negative-bad-key", Msgpack, mpFrame(t, "t", "put", "id", -5, "key", "\xff", "value", 1), ErrDecode},
		{"msgpack/mod-rev-negative", Msgpack, mpFrame(t, "t", "txn", "id", 5, "if", []any{map[string]any{"key": "k", "mod_rev": int64(-1 << 40)}}), ErrDecode},
		// A str must be UTF-8: in a key it is invalid_key, in other fields
		// the message cannot be decoded.
		{"msgpack/key-utf8", Msgpack, mpFrame(t, "t", "put", "id", 5, "key", "a\xff", "value", 1), ErrInvalidKey},
		{"msgpack/prefix-utf8", Msgpack, mpFrame(t, "t", "sub", "id", 5, "room", "r", "prefixes", []string{"a", "\xc0\x80"}), ErrInvalidKey},
		{"msgpack/cond-key-utf8", Msgpack, mpFrame(t, "t", "txn", "id", 5, "if", []any{map[string]any{"key": "\xed\xa0\x80", "mod_rev": 1}}), ErrInvalidKey},
		{"msgpack/op-key-utf8", Msgpack, mpFrame(t, "t", "txn", "id", 5, "ops", []any{map[string]any{"type": "delete", "key": "\xff"}}), ErrInvalidKey},
		{"msgpack/room-utf8", Msgpack, mpFrame(t, "t", "put", "id", 5, "room", "\xff", "key", "k", "value", 1), ErrDecode},
		{"msgpack/filter-utf8", Msgpack, mpFrame(t, "t", "sub", "id", 5, "room", "r", "filter", "value == '\xff'"), ErrDecode},
		{"msgpack/op-utf8", Msgpack, mpFrame(t, "t", "txn", "id", 5, "ops", []any{map[string]any{"op": "\xff", "key": "k"}}), ErrDecode},
		{"msgpack/type-utf8", Msgpack, mpFrame(t, "t", "txn", "id", 5, "ops", []any{map[string]any{"type": "\xff", "key": "k"}}), ErrDecode},
		{"msgpack/t-type", Msgpack, mpFrame(t, "t", 1), ErrDecode},
		{"msgpack/prev-type", Msgpack, mpFrame(t, "t", "sub", "prev", 1), ErrDecode},
		{"msgpack/prefixes-type", Msgpack, mpFrame(t, "t", "sub", "prefixes", "a"), ErrDecode},
		{"msgpack/int-key", Msgpack, []byte{0x81, 0x01, 0xa1, 'x'}, ErrDecode},
		{"msgpack/depth-20000", Msgpack, mpFrame(t, "t", "ping", "x", nestedMsgpack(20000)), ErrDecode},
		{"msgpack/value-bin", Msgpack, put([]byte{0xc4, 2, 'h', 'i'}), ErrInvalidValue},
		{"msgpack/value-ext", Msgpack, put([]byte{0xd4, 7, 0}), ErrInvalidValue},
		{"msgpack/value-ext8", Msgpack, put([]byte{0xc7, 1, 7, 0}), ErrInvalidValue},
		{"msgpack/value-timestamp", Msgpack, put([]byte{0xd6, 0xff, 0, 0, 0, 1}), ErrInvalidValue},
		{"msgpack/value-nan", Msgpack, put([]byte{0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 1}), ErrInvalidValue},
		{"msgpack/value-inf", Msgpack, put([]byte{0xcb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0}), ErrInvalidValue},
		{"msgpack/value-neg-inf", Msgpack, put([]byte{0xcb, 0xff, 0xf0, 0, 0, 0, 0, 0, 0}), ErrInvalidValue},
		{"msgpack/value-nan32", Msgpack, put([]byte{0xca, 0x7f, 0xc0, 0, 0}), ErrInvalidValue},
		{"msgpack/value-int-key", Msgpack, put([]byte{0x81, 0x01, 0xc0}), ErrInvalidValue},
		{"msgpack/value-nil-key", Msgpack, put([]byte{0x81, 0xc0, 0xc0}), ErrInvalidValue},
		{"msgpack/value-bin-key", Msgpack, put([]byte{0x81, 0xc4, 1, 'a', 0xc0}), ErrInvalidValue},
		{"msgpack/value-utf8", Msgpack, put([]byte{0xa1, 0xff}), ErrInvalidValue},
		{"msgpack/value-depth-1000", Msgpack, put(nestedMsgpack(1000)), ErrInvalidValue},
		{"msgpack/value-depth-65", Msgpack, put(nestedMsgpack(65)), ErrInvalidValue},
		{"msgpack/value-nested-bin", Msgpack, put([]byte{0x92, 0x01, 0x81, 0xa1, 'a', 0xc4, 0}), ErrInvalidValue},
		{"msgpack/txn-op-value", Msgpack, mpFrame(t, "t", "txn", "id", 5, "ops",
			append([]byte{0x91, 0x83, 0xa2, 'o', 'p', 0xa3, 'p', 'u', 't', 0xa3, 'k', 'e', 'y', 0xa1, 'k', 0xa5}, "value\xc4\x00"...)), ErrInvalidValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs, err := tc.c.DecodeRequests(tc.frame)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.want == ErrDecode {
				if errors.Is(err, ErrInvalidValue) || reqs != nil {
					t.Errorf("decode error %v came with %v", err, reqs)
				}
				return
			}
			var ve *ValueError
			if !errors.As(err, &ve) || errors.Is(err, ErrDecode) {
				t.Fatalf("err %v is not a bare *ValueError", err)
			}
			if len(reqs) != 1 || reqs[0].ID != 5 || ve.At(0) == nil || ve.At(1) != nil {
				t.Errorf("reqs %+v, %v", reqs, ve.Errs)
			}
		})
	}
}

// A client decoding a server message with a bad value fails outright.
func TestDecodeMessagesBadValue(t *testing.T) {
	frames := map[string][]byte{
		"json":  []byte(`{"t":"ok","id":1}` + "\n" + `{"t":"snapshot","s":1,"items":[{"key":"k","value":[1e999]}]}`),
		"json2": []byte(`{"t":"ok","id":1}` + "\n" + `{"t":"snapshot","s":1,"items":[["k",[1e999],1,1,1]]}`),
		"msgpack": append(mpFrame(t, "t", "ok", "id", 1),
			mpFrame(t, "t", "events", "events", []byte{0x91, 0x81, 0xa5, 'v', 'a', 'l', 'u', 'e', 0xc4, 0})...),
	}
	for _, cd := range codecs {
		msgs, err := cd.c.DecodeMessages(frames[cd.name])
		if !errors.Is(err, ErrDecode) || !errors.Is(err, ErrInvalidValue) || msgs != nil {
			t.Errorf("%s: %v, %v", cd.name, msgs, err)
		}
	}
}

// A frame with bad values still yields all its requests, in order.
func TestValueErrorKeepsOthers(t *testing.T) {
	frames := map[string][]byte{
		"json": []byte(`{"t":"put","id":1,"key":"a","value":1}` + "\n" +
			`{"value":1e999,"t":"put","id":2,"key":"b"}` + "\n" +
			`{"t":"del","id":3,"key":"c"}` + "\n" +
			`{"t":"txn","id":4,"ops":[{"op":"put","key":"d","value":` + nestedJSON(70, "") + `}]}`),
		"msgpack": bytes.Join([][]byte{
			mpFrame(t, "t", "put", "id", 1, "key", "a", "value", 1),
			mpFrame(t, "value", []byte{0xc4, 0}, "t", "put", "id", 2, "key", "b"),
			mpFrame(t, "t", "del", "id", 3, "key", "c"),
			mpFrame(t, "t", "txn", "id", 4, "ops", []byte{0x91, 0x81, 0xa5, 'v', 'a', 'l', 'u', 'e', 0xcb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0}),
		}, nil),
	}
	frames["json2"] = frames["json"] // v2 requests are v1's
	for _, cd := range codecs {
		reqs, err := cd.c.DecodeRequests(frames[cd.name])
		var ve *ValueError
		if !errors.As(err, &ve) {
			t.Fatalf("%s: %v", cd.name, err)
		}
		want := []Request{{T: TPut, ID: 1, Key: "a", Value: Value("1")}, {T: TPut, ID: 2}, {T: TDel, ID: 3, Key: "c"}, {T: TTxn, ID: 4}}
		if diff := cmp.Diff(want, reqs); diff != "" {
			t.Errorf("%s: %s", cd.name, diff)
		}
		for i, bad := range []bool{false, true, false, true} {
			if (ve.At(i) != nil) != bad || (bad && !errors.Is(ve.At(i), ErrInvalidValue)) {
				t.Errorf("%s: At(%d) = %v", cd.name, i, ve.At(i))
			}
		}
		if !errors.Is(err, ErrInvalidValue) || errors.Is(err, ErrDecode) {
			t.Errorf("%s: %v", cd.name, err)
		}
	}
	var none *ValueError
	if none.At(0) != nil {
		t.Error("nil ValueError has errors")
	}
}

// A value error in a message whose id is itself malformed poisons the
// frame: there is no request to answer.
func TestValueErrorWithBadID(t *testing.T) {
	_, err := JSON.DecodeRequests([]byte(`{"t":"put","value":1e999,"id":"x"}`))
	if !errors.Is(err, ErrDecode) {
		t.Errorf("JSON: %v", err)
	}
	_, err = Msgpack.DecodeRequests(mpFrame(t, "t", "put", "value", []byte{0xc4, 0}, "id", "x"))
	if !errors.Is(err, ErrDecode) {
		t.Errorf("msgpack: %v", err)
	}
	// A negative id is no id either (not 2^64-5).
	_, err = Msgpack.DecodeRequests(mpFrame(t, "t", "put", "value", []byte{0xc4, 0}, "id", -5))
	if !errors.Is(err, ErrDecode) {
		t.Errorf("msgpack, id -5: %v", err)
	}
}

// The codecs are shared by every socket: pooled encoders and decoders
// must not leak state between goroutines (run with -race).
func TestConcurrentUse(t *testing.T) {
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			cd := codecs[g%len(codecs)]
			for i := range 200 {
				req := clientRequests()[i%len(clientRequests())]
				frame, err := cd.c.Append(nil, &req)
				if err != nil {
					t.Error(err)
					return
				}
				got, err := cd.c.DecodeRequests(frame)
				if err != nil || !cmp.Equal([]Request{req}, got) {
					t.Errorf("%s: %v, %v", cd.name, got, err)
					return
				}
				list := cd.c.AppendEventList(nil, uint64(i+1), testEvents())
				if msgs, err := cd.c.DecodeMessages(cd.c.AppendEvents(nil, TEvents, 1, uint64(i+1), list)); err != nil ||
					!cmp.Equal(testEvents(), msgs[0].Events) {
					t.Errorf("%s: events %v", cd.name, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestMaxFrameMessages(t *testing.T) {
	for _, cd := range codecs {
		var frame []byte
		for range MaxFrameMessages {
			frame, _ = cd.c.Append(frame, &Request{T: TPing})
		}
		if reqs, err := cd.c.DecodeRequests(frame); err != nil || len(reqs) != MaxFrameMessages {
			t.Errorf("%s: %d, %v", cd.name, len(reqs), err)
		}
		// Clients read server frames of any count.
		frame = frame[:0]
		for range 2 * MaxFrameMessages {
			frame, _ = cd.c.Append(frame, &Pong{T: TPong})
		}
		if msgs, err := cd.c.DecodeMessages(frame); err != nil || len(msgs) != 2*MaxFrameMessages {
			t.Errorf("%s: %d, %v", cd.name, len(msgs), err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// Refusing negative ints keeps every unsigned value: 2^64-1 as uint64,
// and positive ints however they are coded.
func TestMsgpackUnsignedRange(t *testing.T) {
	int64Five := []byte{0xd3, 0, 0, 0, 0, 0, 0, 0, 5}
	reqs, err := Msgpack.DecodeRequests(mpFrame(t, "t", "txn", "id", uint64(1<<64-1), "sub", int64Five,
		"if", []any{map[string]any{"key": "k", "mod_rev": uint64(1 << 63)}}, "from", map[string]any{"epoch": "e", "rev": int8(7)}))
	want := []Request{{T: TTxn, ID: 1<<64 - 1, Sub: 5, If: []Cond{{Key: "k", ModRev: 1 << 63}}, From: &Position{Epoch: "e", Rev: 7}}}
	if diff := cmp.Diff(want, reqs); err != nil || diff != "" {
		t.Errorf("%v: %s", err, diff)
	}
}
