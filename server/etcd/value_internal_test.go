package etcd

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"unicode/utf8"

	"github.com/statecast/statecast/server/wire"
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
