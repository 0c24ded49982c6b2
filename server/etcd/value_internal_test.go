package etcd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"unicode/utf8"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// slowToValue is toValue without its fast paths: JSON that is its own
// canonical form as is, anything else as the JSON string of its text, or
// tagged bytes when it is not UTF-8.
func slowToValue(b []byte) ([]byte, error) {
	if len(b) > 0 && b[0] != '"' && !isTagged(b) {
		if v, err := wire.ValueFromJSON(b); err == nil && bytes.Equal(v, b) {
			return v, nil
		}
	}
	if !utf8.Valid(b) {
		return toValue(b) // the tagged form: no fast path reaches it
	}
	s, _ := json.Marshal(string(b))
	return wire.ValueFromJSON(s)
}

// TestToValueFastPathsKeepTheForm: the fast paths of toValue (no JSON
// parse for what cannot be JSON, plain text quoted as it is) give the
// value the full path gives, for text, JSON, JSON with spaces, escapes,
// HTML characters and random bytes.
func TestToValueFastPathsKeepTheForm(t *testing.T) {
	inputs := []string{"", "v", "hello world", "00000001", "42", "-1.5e3", " 42", "\t{}", "true", "tru", "nul",
		"null", `{"a":1}`, `{"a": 1}`, `[1,2]`, `"quoted"`, `say "hi"`, `back\slash`, "<b>&amp;</b>", "tab\there",
		"line\nbreak", "ünïcode", "\u2028", "\x7f", `{"$bytes":"AAE="}`, `{"$bytes":"AAE="`, "x" + string(rune(0))}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, r.IntN(12))
		for i := range b {
			b[i] = byte(r.IntN(256))
			if r.IntN(2) == 0 {
				b[i] = " \"\\<>&{}[]:,-0123456789tfnulrsea\x7f\x1f"[r.IntN(34)]
			}
		}
		inputs = append(inputs, string(b))
	}
	for _, in := range inputs {
		want, werr := slowToValue([]byte(in))
		got, gerr := toValue([]byte(in))
		if !bytes.Equal(got, want) || (werr == nil) != (gerr == nil) {
			t.Errorf("toValue(%q) = %q, %v; the full path gives %q, %v", in, got, gerr, want, werr)
		}
	}
}

// TestSortByValueDecodesOnce: a range sorted by value orders keys by
// their etcd bytes (escaped values decoded), stably, either way; and
// turns each value into bytes once, not at each comparison.
func TestSortByValueDecodesOnce(t *testing.T) {
	const n = 2000
	items := make([]store.KV, n)
	for i := range items {
		// Escaped, so that each needs decoding: "\n<rank>", ranks shuffled.
		items[i] = store.KV{Key: fmt.Sprintf("k%04d", i), Value: []byte(fmt.Sprintf(`"\n%04d"`, (i*7919)%(n/2)))}
	}
	for _, order := range []pb.RangeRequest_SortOrder{pb.RangeRequest_ASCEND, pb.RangeRequest_DESCEND} {
		r := &pb.RangeRequest{SortOrder: order, SortTarget: pb.RangeRequest_VALUE}
		kvs, _, _ := rangeKVs(items, true, r)
		for i := 1; i < len(kvs); i++ {
			c := bytes.Compare(fromValue(kvs[i-1].Value), fromValue(kvs[i].Value))
			if order == pb.RangeRequest_DESCEND {
				c = -c
			}
			if c > 0 || c == 0 && kvs[i-1].Key > kvs[i].Key {
				t.Fatalf("%v: %s=%q before %s=%q", order, kvs[i-1].Key, kvs[i-1].Value, kvs[i].Key, kvs[i].Value)
			}
		}
	}
	r := &pb.RangeRequest{SortOrder: pb.RangeRequest_ASCEND, SortTarget: pb.RangeRequest_VALUE}
	allocs := testing.AllocsPerRun(3, func() { rangeKVs(items, true, r) })
	// Decoding a value allocates a few objects; at each comparison that
	// was tens of thousands for these 2,000 (n log n comparisons).
	if allocs > 10*n {
		t.Errorf("a sort of %d values allocated %.0f objects, want a few a value", n, allocs)
	}
}
