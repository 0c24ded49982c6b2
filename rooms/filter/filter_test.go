package filter

import (
	"fmt"
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	game := []byte(`{"mode":"duel","players":1,"max":2,"name":"Dune","tags":["eu","ranked"]}`)
	for _, tc := range []struct {
		expr string
		want bool
	}{
		{`value.mode == "duel" && value.players < value.max`, true},
		{`value.players == 1`, true}, // JSON numbers are doubles; CEL compares them with ints
		{`value.max - value.players >= 2`, false},
		{`"eu" in value.tags`, true},
		{`value.name.startsWith("Du") && key.startsWith("games/")`, true},
		{`value.tags.exists(t, t == "ranked") && value.tags.all(t, size(t) < 10)`, true},
		{`value.missing == 1`, false}, // no such field: no match, not an error of the watch
		{`has(value.missing) || value.mode != "duel"`, false},
		{`value`, false}, // not a bool
	} {
		f, err := Compile(tc.expr)
		if err != nil {
			t.Fatalf("%s: %v", tc.expr, err)
		}
		if got := f.Match("games/1", game); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.expr, got, tc.want)
		}
	}
	f, _ := Compile(`value == "x"`)
	if !f.Match("k", []byte(`"x"`)) || f.Match("k", []byte(`not json`)) {
		t.Error("a string value, or a value that is not JSON")
	}
}

func TestCompileErrors(t *testing.T) {
	for _, tc := range []struct {
		expr      string
		line, col int
		msg       string
	}{
		{`value.mode ==`, 1, 14, "Syntax error"},
		{`mode == "duel"`, 1, 1, "undeclared reference to 'mode'"},
		{`value.players + 1`, 1, 1, "not a bool"},
		{`size(key)`, 1, 1, "not a bool"},
		{strings.Repeat("(", 40) + "true" + strings.Repeat(")", 40), 0, 0, "recursion"}, // no position: none is said
		{`value.mode == "duel" &&` + "\n" + ` value.name.matches("^D")`, 2, 20, "matches (a regular expression) is not available"},
		{`matches(value.name, "a+")`, 1, 8, "not available"},
		{strings.Repeat("a", MaxLen+1), 0, 0, "over the limit"},
	} {
		_, err := Compile(tc.expr)
		fe, ok := AsError(err)
		if !ok {
			t.Fatalf("%.40s: %v, want an *Error", tc.expr, err)
		}
		if fe.Line != tc.line || fe.Column != tc.col || !strings.Contains(fe.Error(), tc.msg) {
			t.Errorf("%.40s: %v (at %d:%d), want %q at %d:%d", tc.expr, fe, fe.Line, fe.Column, tc.msg, tc.line, tc.col)
		}
	}
}

// TestCostLimit: an expression whose evaluation would run away is cut
// off by the cost limit and does not match.
func TestCostLimit(t *testing.T) {
	list := "[" + strings.TrimSuffix(strings.Repeat("1,", 30), ",") + "]"
	f, err := Compile(list + ".all(a, " + list + ".all(b, " + list + ".all(c, a + b + c > 0)))")
	if err != nil {
		t.Fatal(err)
	}
	before := EvalErrors.Load()
	if f.Match("k", []byte(`{}`)) || EvalErrors.Load() != before+1 {
		t.Fatal("27,000 iterations passed the cost limit")
	}
}

func TestCacheSharesFilters(t *testing.T) {
	var c Cache
	a, err := c.Get(`value.x == 1`)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := c.Get(`value.x == 1`)
	if a != b {
		t.Fatal("the same expression compiled twice")
	}
	if _, err := c.Get(`value.x ==`); err == nil {
		t.Fatal("no error")
	}
	for i := range cacheEntries + 10 {
		if _, err := c.Get(fmt.Sprintf(`value.x == %d`, i)); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.m) > cacheEntries {
		t.Fatalf("cache holds %d filters, bound %d", len(c.m), cacheEntries)
	}
}

// listOf is a CEL list of n times x.
func listOf(x string, n int) string {
	return "[" + strings.TrimSuffix(strings.Repeat(x+",", n), ",") + "]"
}

// TestWorstCaseRefused: an expression whose worst case over a value of
// the store's largest size is over the budget is refused at compile time,
// with the estimate and the budget. CEL's runtime limit charges `==` on
// lists and maps by their items, so these ran to the end: 80 whole values
// compared per evaluation took 480 ms over an 80 KB value, under the
// room's lock.
func TestWorstCaseRefused(t *testing.T) {
	for _, src := range []string{
		listOf("value", 80) + " == " + listOf("value", 80),
		`value == value`,
		`value.a != value.b`,
		`value in [value, value]`,
		`value.tags.exists(t, t == value)`,
		`value.tags.map(t, value) == value.tags.map(t, value)`,
		`dyn(value) == dyn(value)`,
		`[value.tags.map(t, value)].exists(l, l == [value])`,
	} {
		_, err := Compile(src)
		fe, ok := AsError(err)
		want := fmt.Sprintf("over the budget of %d", DefaultBounds.Budget())
		if !ok || !strings.Contains(fe.Msg, "estimated to cost") || !strings.Contains(fe.Msg, want) {
			t.Errorf("%.50s: %v, want refused with its estimate and %q", src, err, want)
		}
	}
}

// TestWorstCaseFollowsBounds: the estimate is over the store's largest
// value: comparing two values whole fits the budget of a store of 1 KiB
// values, and 80 of them do not.
func TestWorstCaseFollowsBounds(t *testing.T) {
	small := Bounds{MaxKeyBytes: 256, MaxValueBytes: 1 << 10}
	if _, err := CompileBounded(`value == value`, small); err != nil {
		t.Fatalf("value == value over 1 KiB values: %v", err)
	}
	for _, src := range []string{
		listOf("value", 80) + " == " + listOf("value", 80),
		// l holds a value per tag: it may be far larger than one value.
		`[value.tags.map(t, value)].exists(l, l == [value, value])`,
	} {
		if _, err := CompileBounded(src, small); err == nil {
			t.Fatalf("%.50s over 1 KiB values: compiled", src)
		}
	}
	var c Cache
	c.Bounds = small
	if _, err := c.Get(`value == value`); err != nil {
		t.Fatalf("the cache does not compile with its bounds: %v", err)
	}
}

// TestLobbyFiltersFitTheBudget: what lobbies filter by compiles over the
// default 256 KiB values, macros over the value included (the runtime
// limit stops their loops, so they are not charged their range's size).
func TestLobbyFiltersFitTheBudget(t *testing.T) {
	for _, src := range []string{
		`value.mode == "duel" && value.players < 4`,
		`value.mode == "duel" && value.players < value.max`,
		`value.max - value.players >= 2 && "eu" in value.tags`,
		`value.tags.exists(t, t == "ranked") && value.tags.all(t, size(t) < 10)`,
		`value.name.startsWith("Du") && key.startsWith("games/") && value.name.contains("un")`,
		`has(value.owner) && value.owner == key`,
		`value.region in ["eu", "us"] && value.tags == ["eu", "ranked"]`,
		`string(value.a) == string(value.b)`,
	} {
		if _, err := Compile(src); err != nil {
			t.Errorf("%s: %v", src, err)
		}
	}
}
