package filter

import (
	"fmt"
	"maps"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/types"
)

// Bounds are the largest key and value a filter can be evaluated on (the
// store's limits): an expression's worst case is estimated over them.
type Bounds struct {
	MaxKeyBytes, MaxValueBytes int
}

// DefaultBounds are the store's default limits.
var DefaultBounds = Bounds{MaxKeyBytes: 1024, MaxValueBytes: 256 << 10}

func (b Bounds) withDefaults() Bounds {
	if b.MaxKeyBytes <= 0 {
		b.MaxKeyBytes = DefaultBounds.MaxKeyBytes
	}
	if b.MaxValueBytes <= 0 {
		b.MaxValueBytes = DefaultBounds.MaxValueBytes
	}
	return b
}

// Budget is the most an expression's estimated worst case may cost, in
// CEL's units (about 50 ns each): MaxEvalCost, plus one pass over a value
// of MaxValueBytes (a unit a byte), which is what the room pays anyway to
// decode such a value once per write. A filter may cost about as much as
// the write it looks at, never the product of the value's size by
// anything else.
func (b Bounds) Budget() uint64 {
	return MaxEvalCost + uint64(b.withDefaults().MaxValueBytes)
}

// The estimate: CEL's runtime cost limit (MaxEvalCost) stops an
// evaluation as soon as what it was charged passes the limit, so what it
// can do unseen is (a) the work of the one call that crosses the limit,
// charged only once it has returned, and (b) the work CEL charges less
// than it takes: `==` and `in` on lists and maps are charged by their
// number of items, while comparing them walks every nested item
// ([value,…×80] == [value,…×80] was charged 8 and walked 80 values). The
// estimate is the sum of (b) over the expression, a call in a macro's loop
// counted once per iteration the limit lets run (every iteration is
// charged, so at most MaxEvalCost in all), plus the largest (a). CEL's own
// estimator (cel.Env.EstimateCost) multiplies a loop's body by its range
// size, which refused every macro over the value, and charges `==` by
// items, which let the 80-value equality through.
type estimate struct {
	b      Bounds
	types  map[int64]*types.Type
	vars   map[string]uint64 // the bytes of the macros' variables in scope
	hidden uint64            // (b)
	call   uint64            // (a)
}

// estimateCost returns the worst case of the checked expression over b.
func estimateCost(checked *cel.Ast, b Bounds) uint64 {
	native := checked.NativeRep()
	e := &estimate{b: b, types: native.TypeMap(), vars: map[string]uint64{}}
	e.walk(native.Expr(), 1)
	return addSat(e.hidden, e.call)
}

// walk adds the costs of x, evaluated up to mult times.
func (e *estimate) walk(x ast.Expr, mult uint64) {
	switch x.Kind() {
	case ast.SelectKind:
		e.walk(x.AsSelect().Operand(), mult)
	case ast.ListKind:
		for _, el := range x.AsList().Elements() {
			e.walk(el, mult)
		}
	case ast.MapKind:
		for _, en := range x.AsMap().Entries() {
			e.walk(en.AsMapEntry().Key(), mult)
			e.walk(en.AsMapEntry().Value(), mult)
		}
	case ast.ComprehensionKind:
		c := x.AsComprehension()
		e.walk(c.IterRange(), mult)
		e.walk(c.AccuInit(), mult)
		loop := min(mulSat(mult, e.items(c.IterRange())), MaxEvalCost)
		// An item is no bigger than what it ranges over holds; the
		// accumulator of map() and filter() grows without a bound known.
		item := e.itemOf(c.IterRange()).bytes
		restore := e.scope(map[string]uint64{c.IterVar(): item, c.IterVar2(): item, c.AccuVar(): noBound})
		e.walk(c.LoopCondition(), loop)
		e.walk(c.LoopStep(), loop)
		e.walk(c.Result(), mult)
		restore()
	case ast.CallKind:
		c := x.AsCall()
		if c.IsMemberFunction() {
			e.walk(c.Target(), mult)
		}
		for _, a := range c.Args() {
			e.walk(a, mult)
		}
		e.addCall(c, mult)
	}
}

// scope sets the variables vs ("" aside) until the returned func restores
// what they shadowed.
func (e *estimate) scope(vs map[string]uint64) func() {
	old := map[string]uint64{}
	var unset []string
	for name, n := range vs {
		if name == "" {
			continue
		}
		if was, ok := e.vars[name]; ok {
			old[name] = was
		} else {
			unset = append(unset, name)
		}
		e.vars[name] = n
	}
	return func() {
		maps.Copy(e.vars, old)
		for _, name := range unset {
			delete(e.vars, name)
		}
	}
}

// addCall adds the costs of the call c, made up to mult times.
func (e *estimate) addCall(c ast.CallExpr, mult uint64) {
	args := c.Args()
	var hidden, charged uint64
	switch c.FunctionName() {
	case operators.Equals, operators.NotEquals:
		if len(args) == 2 { // strings: a unit per 10 bytes; lists and maps: walked
			a, b := e.side(args[0]), e.side(args[1])
			charged, hidden = min(a.bytes, b.bytes)/10, compare(a, b)
		}
	case operators.Less, operators.LessEquals, operators.Greater, operators.GreaterEquals:
		if len(args) == 2 { // strings; lists and maps are not ordered
			charged = min(e.bytes(args[0]), e.bytes(args[1])) / 10
		}
	case operators.Add:
		if len(args) == 2 {
			charged = addSat(e.bytes(args[0]), e.bytes(args[1])) / 10
		}
	case operators.In:
		if len(args) == 2 {
			charged = e.items(args[1])
			hidden = mulSat(charged, compare(e.side(args[0]), e.itemOf(args[1])))
		}
	case "contains", "startsWith", "endsWith":
		if c.IsMemberFunction() && len(args) == 1 {
			charged = mulSat(e.bytes(c.Target())/10+1, e.bytes(args[0])/10+1)
		}
	}
	e.call = max(e.call, charged)
	e.hidden = addSat(e.hidden, mulSat(mult, hidden))
}

// side is an operand of a comparison: how many bytes it may hold, and
// whether it may be a list or a map.
type side struct {
	bytes     uint64
	container bool
}

// compare is what comparing a with b may cost beyond its charge: walking
// the smaller when both may be lists or maps; a string or a number is
// charged what it costs.
func compare(a, b side) uint64 {
	if !a.container || !b.container {
		return 0
	}
	return min(a.bytes, b.bytes)
}

func (e *estimate) side(x ast.Expr) side {
	return side{bytes: e.bytes(x), container: e.container(x)}
}

// container reports whether x may yield a list or a map.
func (e *estimate) container(x ast.Expr) bool {
	t := e.types[x.ID()]
	if t == nil {
		return true
	}
	switch t.Kind() {
	case types.DynKind, types.AnyKind, types.ListKind, types.MapKind:
		return true
	}
	return false
}

// itemOf is an item of the list x, as the side of a comparison.
func (e *estimate) itemOf(x ast.Expr) side {
	if x.Kind() != ast.ListKind {
		return side{bytes: e.bytes(x), container: true}
	}
	var s side
	for _, el := range x.AsList().Elements() {
		s.bytes = max(s.bytes, e.bytes(el))
		s.container = s.container || e.container(el)
	}
	return s
}

// items bounds the number of items of the list or map x: a JSON list of
// n items takes at least 2n-1 bytes.
func (e *estimate) items(x ast.Expr) uint64 {
	switch x.Kind() {
	case ast.ListKind:
		return uint64(len(x.AsList().Elements()))
	case ast.MapKind:
		return uint64(len(x.AsMap().Entries()))
	}
	return e.bytes(x)/2 + 1
}

// bytes bounds the size of what x yields, nested lists and maps counted
// whole: a unit per byte of a string, per number, bool or null.
func (e *estimate) bytes(x ast.Expr) uint64 {
	switch x.Kind() {
	case ast.LiteralKind:
		switch v := x.AsLiteral().(type) {
		case types.String:
			return uint64(len(v)) + 1
		case types.Bytes:
			return uint64(len(v)) + 1
		}
		return 1
	case ast.IdentKind:
		if n, ok := e.vars[x.AsIdent()]; ok { // a macro's variable
			return n
		}
		switch x.AsIdent() {
		case "key":
			return uint64(e.b.MaxKeyBytes)
		case "value":
			return uint64(e.b.MaxValueBytes)
		}
		return noBound
	case ast.SelectKind:
		if x.AsSelect().IsTestOnly() {
			return 1
		}
		return e.bytes(x.AsSelect().Operand())
	case ast.ListKind:
		n := uint64(1)
		for _, el := range x.AsList().Elements() {
			n = addSat(n, e.bytes(el))
		}
		return n
	case ast.MapKind:
		n := uint64(1)
		for _, en := range x.AsMap().Entries() {
			n = addSat(n, addSat(e.bytes(en.AsMapEntry().Key()), e.bytes(en.AsMapEntry().Value())))
		}
		return n
	case ast.CallKind:
		c := x.AsCall()
		args := c.Args()
		switch {
		case c.FunctionName() == operators.Index && len(args) == 2:
			return e.bytes(args[0])
		case c.FunctionName() == operators.Conditional && len(args) == 3:
			return max(e.bytes(args[1]), e.bytes(args[2]))
		case c.FunctionName() == operators.Add && len(args) == 2:
			return addSat(e.bytes(args[0]), e.bytes(args[1]))
		case arithmetic[c.FunctionName()]:
			return 1
		case !e.container(x):
			// A bool or a number, or a string (a conversion, a
			// concatenation) no longer than what it was made of.
			n := uint64(1)
			if c.IsMemberFunction() {
				n = addSat(n, e.bytes(c.Target()))
			}
			for _, a := range args {
				n = addSat(n, e.bytes(a))
			}
			return n
		}
	}
	return noBound // a list made by a macro or a concatenation
}

const noBound = ^uint64(0)

// arithmetic are the operators that yield a number.
var arithmetic = map[string]bool{operators.Subtract: true, operators.Multiply: true, operators.Divide: true,
	operators.Modulo: true, operators.Negate: true}

// addSat and mulSat saturate at noBound (no bound known).
func addSat(a, b uint64) uint64 {
	if a > noBound-b {
		return noBound
	}
	return a + b
}

func mulSat(a, b uint64) uint64 {
	if a != 0 && b > noBound/a {
		return noBound
	}
	return a * b
}

// costString is c, or "unbounded".
func costString(c uint64) string {
	if c == noBound {
		return "unbounded"
	}
	return fmt.Sprint(c)
}
