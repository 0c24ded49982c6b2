// Package filter compiles the expressions of filtered watches: CEL (the
// language Kubernetes uses for the same job) over one key and its JSON
// value, e.g.
//
//	value.mode == "duel" && value.players < value.max
//
// An expression sees two variables: `key` (string) and `value` (the key's
// JSON value: objects are maps, numbers doubles). It must yield a bool.
// An expression whose worst case over the store's largest key and value
// could cost more than a budget is refused at compile time (cost.go);
// evaluation is bounded by a cost limit; an evaluation that fails (a
// missing field, a type mismatch, the limit) counts as no match, so a key
// whose value lacks a field is simply not selected.
package filter

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common"
	celast "cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/interpreter"
)

// Limits of an expression: its length, its nesting, and the CEL cost of
// one evaluation (about one unit per operation, plus the size of the
// strings and lists it walks).
const (
	MaxLen       = 1024
	MaxNesting   = 32
	MaxEvalCost  = 1_000
	cacheEntries = 1024
)

// Filter is a compiled expression. It is safe for concurrent use.
type Filter struct {
	src string
	prg cel.Program
}

// Error is a filter that does not compile: Line and Column (from 1) point
// at the fault in the expression.
type Error struct {
	Line, Column int
	Msg          string
}

func (e *Error) Error() string {
	if e.Line == 0 {
		return "invalid filter: " + e.Msg
	}
	return fmt.Sprintf("invalid filter at %d:%d: %s", e.Line, e.Column, e.Msg)
}

var env = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("key", cel.StringType),
		cel.Variable("value", cel.DynType),
		cel.ParserExpressionSizeLimit(MaxLen),
		cel.ParserRecursionLimit(MaxNesting),
	)
})

// Evals counts evaluations, and EvalErrors those that failed (and so did
// not match), for the server's metrics.
var Evals, EvalErrors atomic.Int64

// Compile is CompileBounded with DefaultBounds.
func Compile(src string) (*Filter, error) { return CompileBounded(src, DefaultBounds) }

// CompileBounded parses and checks src, and refuses it when its worst
// case over a key and value within b could cost more than b.Budget().
// Its error is an *Error.
func CompileBounded(src string, b Bounds) (*Filter, error) {
	b = b.withDefaults()
	if len(src) > MaxLen {
		return nil, &Error{Msg: fmt.Sprintf("the expression is %d bytes, over the limit of %d", len(src), MaxLen)}
	}
	e, err := env()
	if err != nil {
		return nil, err
	}
	ast, iss := e.Compile(src)
	if iss.Err() != nil {
		errs := iss.Errors()
		if len(errs) == 0 {
			return nil, &Error{Msg: iss.Err().Error()}
		}
		first := errs[0]
		return nil, errorAt(first.Location, first.Message)
	}
	if err := refuseUnbounded(ast); err != nil {
		return nil, err
	}
	if t := ast.OutputType(); !t.IsExactType(types.BoolType) && !t.IsExactType(types.DynType) {
		return nil, &Error{Line: 1, Column: 1, Msg: fmt.Sprintf("the expression yields %s, not a bool", t)}
	}
	if err := refuseCostly(ast, b); err != nil {
		return nil, err
	}
	prg, err := e.Program(ast, cel.EvalOptions(cel.OptOptimize), cel.CostLimit(MaxEvalCost))
	if err != nil {
		return nil, &Error{Msg: err.Error()}
	}
	return &Filter{src: src, prg: prg}, nil
}

// unbounded are the functions whose time the cost limit does not bound:
// CEL charges a call after it returns, and a regular expression's time
// grows with the value's length times the pattern's (a 30-byte pattern
// over a 250 KB value took 12 s), all of it under the room's lock.
var unbounded = map[string]string{
	"matches": "matches (a regular expression) is not available in filters: its time grows with the value's size times the pattern's; use ==, startsWith, endsWith or contains",
}

// refuseUnbounded refuses an expression that calls an unbounded function.
func refuseUnbounded(ast *cel.Ast) error {
	native := ast.NativeRep()
	var err *Error
	celast.PreOrderVisit(native.Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		if err != nil || e.Kind() != celast.CallKind {
			return
		}
		if msg, ok := unbounded[e.AsCall().FunctionName()]; ok {
			err = errorAt(native.SourceInfo().GetStartLocation(e.ID()), msg)
		}
	}))
	if err != nil {
		return err
	}
	return nil
}

// refuseCostly refuses an expression whose estimated worst case is over
// b's budget.
func refuseCostly(ast *cel.Ast, b Bounds) error {
	if est := estimateCost(ast, b); est > b.Budget() {
		return &Error{Msg: fmt.Sprintf("its worst case over a %d-byte value is estimated to cost %s, over the budget of %d "+
			"(compare fields with literals, or convert both sides with string() or double(): comparing two lists or maps walks them whole)", b.MaxValueBytes, costString(est), b.Budget())}
	}
	return nil
}

// errorAt is msg at loc, or without a position when CEL gives none.
func errorAt(loc common.Location, msg string) *Error {
	if loc == nil || loc.Line() < 1 {
		return &Error{Msg: msg}
	}
	return &Error{Line: loc.Line(), Column: loc.Column() + 1, Msg: msg}
}

// String returns the expression.
func (f *Filter) String() string { return f.src }

// Match reports whether key, with the JSON value, passes f. A value that
// is not JSON, or an evaluation that fails, does not match.
func (f *Filter) Match(key string, value []byte) bool {
	var v any
	if err := json.Unmarshal(value, &v); err != nil {
		Evals.Add(1)
		EvalErrors.Add(1)
		return false
	}
	return f.MatchValue(key, v)
}

// MatchValue is Match on a value already decoded by encoding/json.
func (f *Filter) MatchValue(key string, value any) bool {
	Evals.Add(1)
	out, _, err := f.prg.Eval(&vars{key: key, value: value})
	if err != nil {
		EvalErrors.Add(1)
		return false
	}
	b, ok := out.Value().(bool)
	if !ok {
		EvalErrors.Add(1)
	}
	return b
}

// vars is an evaluation's variables: lighter than the map Eval also takes.
type vars struct {
	key   string
	value any
}

func (v *vars) ResolveName(name string) (any, bool) {
	switch name {
	case "key":
		return v.key, true
	case "value":
		return v.value, true
	}
	return nil, false
}

func (v *vars) Parent() interpreter.Activation { return nil }

// Cache hands out one *Filter per expression text, so that watchers with
// the same filter share it (and the room evaluates it once per event).
// It keeps up to 1024 expressions; past that it forgets one at random,
// which costs a compile, never correctness.
type Cache struct {
	Bounds Bounds // the keys and values filters are estimated over; zero: DefaultBounds

	mu sync.Mutex
	m  map[string]*Filter
}

// Get returns the compiled src, compiling it on first use.
func (c *Cache) Get(src string) (*Filter, error) {
	c.mu.Lock()
	f := c.m[src]
	c.mu.Unlock()
	if f != nil {
		return f, nil
	}
	f, err := CompileBounded(src, c.Bounds)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if g := c.m[src]; g != nil {
		return g, nil
	}
	if c.m == nil {
		c.m = make(map[string]*Filter)
	}
	if len(c.m) >= cacheEntries {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[src] = f
	return f, nil
}

// AsError returns err as an *Error when it is one.
func AsError(err error) (*Error, bool) {
	var fe *Error
	ok := errors.As(err, &fe)
	return fe, ok
}
