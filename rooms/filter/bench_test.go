package filter

import (
	"encoding/json"
	"strings"
	"testing"

	"cel.dev/cel-go/cel"
)

// maxValue is a JSON object of about DefaultBounds.MaxValueBytes holding
// field, whose items are item.
func maxValue(tb testing.TB, field, item string) any {
	n := (DefaultBounds.MaxValueBytes - 16) / (len(item) + 1)
	src := `{"` + field + `":[` + strings.TrimSuffix(strings.Repeat(item+",", n), ",") + `]}`
	var v any
	if err := json.Unmarshal([]byte(src), &v); err != nil {
		tb.Fatal(err)
	}
	return v
}

// BenchmarkWorstAccepted evaluates the costliest filters that compile over
// the default bounds, on a value of the largest size, beside decoding
// that value (what the room pays for each write of it anyway) and the
// refused value == value (compiled without the budget, for scale).
func BenchmarkWorstAccepted(b *testing.B) {
	inner := listOf("0", 120)
	for _, bc := range []struct {
		name, src, field, item string
		refused                bool
	}{
		{"in-list", `"eu" in value.l`, "l", "1", false},
		{"exists-list-equality", `value.l.exists(x, x == ` + inner + `)`, "l", inner, false},
		{"contains", `value.l[0].contains("` + strings.Repeat("ab", 45) + `")`, "l", `"` + strings.Repeat("a", 200) + `"`, false},
		{"refused-value-equality", `value == value`, "l", `{"a":[1,2,3]}`, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			f, err := Compile(bc.src)
			if (err != nil) != bc.refused {
				b.Fatalf("refused: %v, want %v", err, bc.refused)
			}
			if bc.refused {
				f = compileUnbudgeted(b, bc.src)
			}
			v := maxValue(b, bc.field, bc.item)
			b.ResetTimer()
			for b.Loop() {
				f.MatchValue("k", v)
			}
		})
	}
	b.Run("decode-value", func(b *testing.B) {
		raw, _ := json.Marshal(maxValue(b, "l", `{"a":[1,2,3]}`))
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			var v any
			if err := json.Unmarshal(raw, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// compileUnbudgeted compiles src as Compile did before it had a budget.
func compileUnbudgeted(tb testing.TB, src string) *Filter {
	e, err := env()
	if err != nil {
		tb.Fatal(err)
	}
	ast, iss := e.Compile(src)
	if iss.Err() != nil {
		tb.Fatal(iss.Err())
	}
	prg, err := e.Program(ast, cel.EvalOptions(cel.OptOptimize), cel.CostLimit(MaxEvalCost))
	if err != nil {
		tb.Fatal(err)
	}
	return &Filter{src: src, prg: prg}
}
