package wire

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

// The exact v2 encodings of PROTOCOL.md §11: its examples, byte for byte.
func TestDenseExactEncoding(t *testing.T) {
	for _, tc := range []struct {
		name string
		rev  uint64
		t    string
		evs  []Event
		want string
	}{
		{"put and delete", 58, TEvents, []Event{
			{Type: "put", Key: "games/7", Value: Value(`{"name":"Dune","players":3,"max":4}`), CreateRev: 12, ModRev: 58, Version: 6},
			{Type: "delete", Key: "games/9", ModRev: 58}},
			`{"t":"events","s":1,"r":58,"e":[["games/7",{"name":"Dune","players":3,"max":4},12,6],["games/9"]]}`},
		{"coalesced delete keeps its mod_rev", 72, TCoalesced, []Event{{Type: "delete", Key: "k", ModRev: 70}},
			`{"t":"coalesced","s":1,"r":72,"e":[["k",{"m":70}]]}`},
		{"lease and wid", 9, TEvents, []Event{{Type: "put", Key: "p/ann", Value: Value(`1`), CreateRev: 3, ModRev: 9, Version: 2, Lease: true, Wid: "w1"}},
			`{"t":"events","s":1,"r":9,"e":[["p/ann",1,3,2,{"l":1,"w":"w1"}]]}`},
		{"prev, leave, a key to escape", 5, TEvents, []Event{
			{Type: "put", Key: "a\"b", Value: Value(`null`), CreateRev: 1, ModRev: 5, Version: 2,
				Prev: &Item{Value: Value(`"x"`), CreateRev: 1, ModRev: 4, Version: 1}},
			{Type: "leave", Key: "g", ModRev: 5},
			{Type: "delete", Key: "p/bo", ModRev: 5, Prev: &Item{Value: Value(`1`), CreateRev: 2, ModRev: 3, Version: 2, Lease: true}}},
			`{"t":"events","s":1,"r":5,"e":[["a\"b",null,1,2,{"p":["x",1,4,1]}],["g",{"x":1}],["p/bo",{"p":[1,2,3,2,1]}]]}`},
		{"no events", 3, TEvents, nil, `{"t":"events","s":1,"r":3,"e":[]}`},
	} {
		got := JSON2.AppendEvents(nil, tc.t, 1, tc.rev, JSON2.AppendEventList(nil, tc.rev, tc.evs))
		if string(got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
		msgs, err := JSON2.DecodeMessages(got)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, fast, _ := denseEvents(got); !fast {
			t.Errorf("%s: the server's message does not take the fast path of decoding", tc.name)
		}
		want := []Message{{T: tc.t, S: 1, Rev: tc.rev, Events: tc.evs}}
		if tc.evs == nil {
			want[0].Events = []Event{}
		}
		if diff := cmp.Diff(want, msgs); diff != "" {
			t.Errorf("%s: decoded (-want +got):\n%s", tc.name, diff)
		}
	}

	snap, err := JSON2.Append(nil, &Snapshot{T: TSnapshot, S: 1, Epoch: "9f2c41d07a3b11e8", Rev: 57, Reason: "initial", Items: []Item{
		{Key: "games/7", Value: Value(`{"name":"Dune","players":2,"max":4}`), CreateRev: 12, ModRev: 57, Version: 5},
		{Key: "p/ann", Value: Value(`true`), CreateRev: 3, ModRev: 9, Version: 2, Lease: true}}})
	want := `{"t":"snapshot","s":1,"epoch":"9f2c41d07a3b11e8","rev":57,"reason":"initial",` +
		`"items":[["games/7",{"name":"Dune","players":2,"max":4},12,57,5],["p/ann",true,3,9,2,{"l":1}]]}`
	if err != nil || string(snap) != want {
		t.Errorf("snapshot:\n got %s, %v\nwant %s", snap, err, want)
	}
	// Every other message is v1's, connected included (its v is the server's to set).
	ok, _ := JSON2.Append(nil, &OK{T: TOK, ID: 2, Rev: 51})
	if string(ok) != `{"t":"ok","id":2,"rev":51}` {
		t.Errorf("ok: %s", ok)
	}
}

// A client decoding a malformed v2 message fails outright, never guesses.
func TestDenseDecodeRejects(t *testing.T) {
	for _, frame := range []string{
		`{"t":"events","s":1,"r":5,"e":[["k",1,2]]}`,                     // 3 elements
		`{"t":"events","s":1,"r":5,"e":[["k",1,2,3,{},6]]}`,              // 6 elements
		`{"t":"events","s":1,"r":5,"e":[["k",null]]}`,                    // extras not an object
		`{"t":"events","s":1,"r":5,"e":[["k",1,2,3,[1]]]}`,               // extras not an object
		`{"t":"events","s":1,"r":5,"e":[[7]]}`,                           // key not a string
		`{"t":"events","s":1,"r":5,"e":[{"type":"put"}]}`,                // a v1 event
		`{"t":"events","s":1,"r":5,"e":[["k",1,"2",3]]}`,                 // create_rev not a number
		`{"t":"events","s":1,"r":5,"e":[["k",1,2,3,{"p":[1]}]]}`,         // short prev
		`{"t":"events","s":1,"r":5,"e":[["k",1,2,3,{"p":[1,2,3,4,0]}]]}`, // prev lease not 1
		`{"t":"snapshot","s":1,"rev":5,"items":[["k",1,2,3]]}`,           // 4 elements
		`{"t":"snapshot","s":1,"rev":5,"items":[{"key":"k"}]}`,           // a v1 item
		`{"t":"snapshot","s":1,"rev":5,"items":[["k",[1e999],1,1,1]]}`,
	} {
		if msgs, err := JSON2.DecodeMessages([]byte(frame)); !errors.Is(err, ErrDecode) || msgs != nil {
			t.Errorf("%s: %v, %v", frame, msgs, err)
		}
	}
	// Unknown extras fields are ignored, as the protocol asks.
	msgs, err := JSON2.DecodeMessages([]byte(`{"t":"events","s":1,"r":5,"e":[["k",{"z":[1,2],"m":4}]]}`))
	if err != nil || len(msgs) != 1 || !cmp.Equal(msgs[0].Events, []Event{{Type: "delete", Key: "k", ModRev: 4}}) {
		t.Errorf("unknown extras: %+v, %v", msgs, err)
	}
}

// Whitespace between tokens and brackets or commas inside strings do not
// confuse the splitting of arrays.
func TestDenseDecodeSpacing(t *testing.T) {
	frame := `{"t":"events", "s":1, "r":5, "e":[ ["k,]\"" , {"a": [1, "x]\\"], "b":{}} , 1 , 2 ] ,` + "\t" + `[ "d" ] ]}`
	msgs, err := JSON2.DecodeMessages([]byte(frame))
	if err != nil {
		t.Fatal(err)
	}
	want := []Message{{T: TEvents, S: 1, Rev: 5, Events: []Event{
		{Type: "put", Key: `k,]"`, Value: Value(`{"a":[1,"x]\\"],"b":{}}`), CreateRev: 1, ModRev: 5, Version: 2},
		{Type: "delete", Key: "d", ModRev: 5}}}}
	if diff := cmp.Diff(want, msgs); diff != "" {
		t.Error(diff)
	}
}

// The v1 JSON event list, written by hand, is what encoding/json writes for
// the same events, byte for byte, whatever fields they hold.
func TestEventListMatchesEncodingJSON(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		str := rapid.OneOf(rapid.SampledFrom([]string{"", "k", "games/7", `a"b\c`, "tab\tnl\n\x01\b\f\x1f\x7f", "é😀", "<&>"}),
			rapid.StringMatching(`[a-z/"\\ ]{0,8}`))
		val := rapid.SampledFrom([]Value{nil, Value(`null`), Value(`1`), Value(`"x\n"`), Value(richValue), Value(`{"a":[1,{}]}`)})
		item := func(t *rapid.T) *Item {
			if !rapid.Bool().Draw(t, "prev") {
				return nil
			}
			return &Item{Key: str.Draw(t, "pkey"), Value: val.Draw(t, "pvalue"), CreateRev: rapid.Uint64().Draw(t, "pc"),
				ModRev: rapid.Uint64().Draw(t, "pm"), Version: rapid.Uint64Range(0, 3).Draw(t, "pv"), Lease: rapid.Bool().Draw(t, "pl")}
		}
		evs := make([]Event, rapid.IntRange(0, 4).Draw(t, "n"))
		for i := range evs {
			evs[i] = Event{Type: rapid.SampledFrom([]string{"put", "delete", "leave"}).Draw(t, "type"), Key: str.Draw(t, "key"),
				Value: val.Draw(t, "value"), CreateRev: rapid.Uint64Range(0, 3).Draw(t, "c"), ModRev: rapid.Uint64().Draw(t, "m"),
				Version: rapid.Uint64Range(0, 3).Draw(t, "v"), Lease: rapid.Bool().Draw(t, "l"), Prev: item(t), Wid: str.Draw(t, "wid")}
		}
		want, err := appendJSON(nil, evs)
		if err != nil {
			t.Fatal(err)
		}
		if got := JSON.AppendEventList(nil, 0, evs); string(got) != string(want) {
			t.Fatalf("by hand:\n%s\nencoding/json:\n%s", got, want)
		}
	})
}
