package main

// The linearizability check of issue 19, with porcupine (the checker of
// etcd's robustness tests): clients run GET, PUT, CAS (If-Match) and
// DELETE on a few keys of one room, each operation on a random node, and
// the history, partitioned by key, must be linearizable against a
// key/value model. A write whose outcome the client could not learn (an
// error that is not a clean refusal) is left open-ended: it may have taken
// effect at any time after its call, or never. So a fault injector (node
// SIGKILL, Redis connection cuts, a Redis restart) can run next to the
// clients (lzRun's faults) without changing the check; the runs here are
// without faults (TestLinearizableRedis…) and with them
// (TestLinearizableRedisFaults; TestLinearizableSoak at length).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/statecast/statecast/client"
)

// lzInput is one operation: op is get, put, cas or del; ifRev is the
// mod_rev a cas expects (0: the key must not exist).
type lzInput struct {
	op, key, value string
	ifRev          uint64
}

// lzOutput is what the client saw.
type lzOutput struct {
	unknown  bool   // a write whose outcome is unknown
	conflict bool   // a cas refused
	found    bool   // get: the key exists
	value    string // get: its value
	modRev   uint64 // get: its mod_rev; put, cas: the revision written
	epoch    string // the reply's X-Statecast-Epoch ("" when unknown)
}

// lzState is one key in the model; modRev 0 on an existing key means it
// was written by a write of unknown outcome (its revision is unknown).
type lzState struct {
	exists bool
	value  string
	modRev uint64
}

var lzModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(lzInput).key
			if by[k] == nil {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() []any { return []any{lzState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(lzState), input.(lzInput), output.(lzOutput)
		written := func(rev uint64) lzState { return lzState{exists: true, value: in.value, modRev: rev} }
		switch in.op {
		case "get":
			if out.found != s.exists || out.found && (out.value != s.value || s.modRev != 0 && out.modRev != s.modRev) {
				return nil
			}
			if out.found && s.modRev == 0 { // now it is known
				return []any{lzState{exists: true, value: s.value, modRev: out.modRev}}
			}
			return []any{s}
		case "put":
			if out.unknown {
				return []any{s, written(0)}
			}
			if s.modRev != 0 && out.modRev <= s.modRev {
				return nil // revisions only grow
			}
			return []any{written(out.modRev)}
		case "cas":
			holds := s.exists && (s.modRev == 0 || s.modRev == in.ifRev) || !s.exists && in.ifRev == 0
			switch {
			case out.unknown && holds:
				return []any{s, written(0)}
			case out.unknown:
				return []any{s}
			case out.conflict && (!holds || s.exists && s.modRev == 0):
				return []any{s}
			case !out.conflict && holds:
				return []any{written(out.modRev)}
			}
			return nil
		case "del":
			if out.unknown {
				return []any{s, lzState{}}
			}
			return []any{lzState{}}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(lzInput), output.(lzOutput)
		switch {
		case out.unknown:
			return fmt.Sprintf("%s(%s,%s,%d) -> ?", in.op, in.key, in.value, in.ifRev)
		case in.op == "get" && !out.found:
			return fmt.Sprintf("get(%s) -> none", in.key)
		case in.op == "get":
			return fmt.Sprintf("get(%s) -> %s@%d", in.key, out.value, out.modRev)
		case out.conflict:
			return fmt.Sprintf("cas(%s,%s,if %d) -> conflict", in.key, in.value, in.ifRev)
		}
		return fmt.Sprintf("%s(%s,%s,%d) -> @%d", in.op, in.key, in.value, in.ifRev, out.modRev)
	},
}

// lzRun runs clients × ops operations on the keys a, b and c (after
// prefix) of one room, each on a random one of urls, and checks the
// history. With faults, the clients go on (an operation every few
// milliseconds) until faults returns, however many operations that takes.
// Runs one after another use distinct prefixes: a write of unknown outcome
// may still land during the next.
func lzRun(t *testing.T, urls []string, prefix string, clients, ops int, faults func(ctx context.Context)) {
	t.Helper()
	lzCheck(t, urls, prefix, clients, ops, faults, lzModel)
}

// lzCheck is lzRun against model.
func lzCheck(t *testing.T, urls []string, prefix string, clients, ops int, faults func(ctx context.Context), model porcupine.NondeterministicModel) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	more := func(i int) bool { return i < ops }
	if faults != nil {
		fctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); faults(fctx) }()
		defer func() { stop(); <-done }()
		more = func(int) bool {
			select {
			case <-done:
				return false
			case <-time.After(3 * time.Millisecond):
				return true
			}
		}
	}
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	var (
		mu               sync.Mutex
		history          []porcupine.Operation
		unknown, dropped int
		wg               sync.WaitGroup
	)
	keys := []string{prefix + "a", prefix + "b", prefix + "c"}
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 19))
			hs := make([]*client.HTTP, len(urls))
			rec := &epochRecorder{}
			for i, u := range urls {
				hs[i] = &client.HTTP{URL: u, Client: &http.Client{Transport: rec}}
			}
			seen := map[string]uint64{} // the last mod_rev this client read, per key
			for i := 0; more(i); i++ {
				h := hs[rng.IntN(len(hs))]
				in := lzInput{key: keys[rng.IntN(len(keys))], value: fmt.Sprintf("%d.%d", c, i)}
				switch p := rng.IntN(10); {
				case p < 4:
					in.op = "get"
				case p < 7:
					in.op = "put"
				case p < 9:
					in.op, in.ifRev = "cas", seen[in.key]
				default:
					in.op = "del"
				}
				call := now()
				rec.epoch = ""
				out, ok := lzDo(ctx, h, in)
				ret := now()
				if !out.unknown {
					out.epoch = rec.epoch
				}
				if !ok {
					mu.Lock()
					dropped++ // a failed read saw nothing; a refused write did nothing
					mu.Unlock()
					continue
				}
				if out.unknown {
					ret = math.MaxInt64 // it may take effect at any time
				}
				if in.op == "get" && out.found {
					seen[in.key] = out.modRev
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
				if out.unknown {
					unknown++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res, info := porcupine.CheckOperationsVerbose(model.ToModel(), history, 30*time.Second)
	t.Logf("%d operations by %d clients on %d node(s) (%d writes of unknown outcome, %d failed operations left out): %v",
		len(history), clients, len(urls), unknown, dropped, res)
	if res != porcupine.Ok {
		if f, err := writeLzVisualization(t, model, info); err == nil {
			t.Logf("visualization: %s", f)
		}
		t.Fatalf("history is not linearizable (%v)", res)
	}
}

// lzDo runs one operation; ok is false for a read that failed.
func lzDo(ctx context.Context, h *client.HTTP, in lzInput) (out lzOutput, ok bool) {
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var err error
	switch in.op {
	case "get":
		item, _, gerr := h.Get(octx, "lz", in.key)
		switch {
		case errors.Is(gerr, client.ErrNotFound):
			return lzOutput{}, true
		case gerr != nil:
			return lzOutput{}, false
		}
		var v string
		if json.Unmarshal(item.Value, &v) != nil {
			v = string(item.Value)
		}
		return lzOutput{found: true, value: v, modRev: item.ModRev}, true
	case "put":
		out.modRev, err = h.Put(octx, "lz", in.key, json.RawMessage(`"`+in.value+`"`), nil, "")
	case "cas":
		rev := in.ifRev
		out.modRev, err = h.Put(octx, "lz", in.key, json.RawMessage(`"`+in.value+`"`), &rev, "")
		if errors.Is(err, client.ErrConflict) {
			return lzOutput{conflict: true}, true
		}
	case "del":
		_, err = h.Delete(octx, "lz", in.key, nil)
	}
	if err != nil {
		// A write refused before it reached the store (rate limit, an
		// unreachable store) did nothing; anything else may have. A
		// refused connection never carried the request.
		if errors.Is(err, client.ErrRateLimited) || errors.Is(err, client.ErrBadRequest) || errors.Is(err, syscall.ECONNREFUSED) {
			return lzOutput{}, false
		}
		return lzOutput{unknown: true}, true
	}
	return out, true
}

func writeLzVisualization(t *testing.T, model porcupine.NondeterministicModel, info porcupine.LinearizationInfo) (string, error) {
	f := t.TempDir() + "/history.html"
	return f, porcupine.VisualizePath(model.ToModel(), info, f)
}

// epochRecorder is an http.RoundTripper that keeps the X-Statecast-Epoch
// of the last reply: one client's, whose requests are sequential.
type epochRecorder struct{ epoch string }

func (r *epochRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if resp != nil {
		r.epoch = resp.Header.Get("X-Statecast-Epoch")
	}
	return resp, err
}

// lzEpochState is one key in lzEpochModel: lzModel's state in the epoch
// of the room it is in, the epochs left behind, and acked, the mod_rev of
// the last acknowledged write of the key (0 when that was a delete, or
// a delete may have followed it).
type lzEpochState struct {
	lzState
	wild   bool   // a new epoch began and nothing of the key was seen in it yet
	epoch  string // "" until an operation says
	past   string // epochs left, each followed by ","
	acked  uint64
	wasDel bool // the key was deleted in the model since acked was set
}

// lzEpochModel checks histories across a room's epoch changes (a Redis
// failover that lost writes): within one epoch, as lzModel (no stale read,
// no revision reused, revisions grow); a room never goes back to an epoch
// it left; an operation answered in a new epoch may find the key in any
// state, except that with keepAcked every acknowledged write must have
// survived (the key at its revision or later).
func lzEpochModel(keepAcked bool) porcupine.NondeterministicModel {
	m := lzModel
	m.Init = func() []any { return []any{lzEpochState{}} }
	m.Step = func(state, input, output any) []any {
		s, in, out := state.(lzEpochState), input.(lzInput), output.(lzOutput)
		if out.epoch != "" && strings.Contains(s.past, out.epoch+",") {
			return nil // back to an epoch left
		}
		if out.epoch != "" && s.epoch != "" && out.epoch != s.epoch { // a new epoch
			s = lzEpochState{wild: true, epoch: out.epoch, past: s.past + s.epoch + ",", acked: s.acked, wasDel: s.wasDel}
		}
		if s.epoch == "" {
			s.epoch = out.epoch
		}
		if s.wild {
			switch {
			case out.unknown, in.op == "cas" && out.conflict:
				return []any{s} // still nothing known
			case in.op == "get" && keepAcked && s.acked > 0 && !s.wasDel && (!out.found || out.modRev < s.acked):
				return nil // an acknowledged write lost
			case in.op == "get" && out.found:
				s.lzState = lzState{exists: true, value: out.value, modRev: out.modRev}
			case in.op == "get" || in.op == "del":
				s.lzState = lzState{}
			default: // put, cas acknowledged
				s.lzState = lzState{exists: true, value: in.value, modRev: out.modRev}
			}
			s.wild = false
			return lzEpochAcked(s, in, out)
		}
		var next []any
		for _, n := range lzModel.Step(s.lzState, input, output) {
			ns := s
			ns.lzState = n.(lzState)
			if out.unknown && in.op == "del" && !ns.exists {
				ns.wasDel = true
			}
			next = append(next, lzEpochAcked(ns, in, out)[0])
		}
		return next
	}
	m.DescribeOperation = func(input, output any) string {
		out := output.(lzOutput)
		e := out.epoch
		if len(e) > 4 {
			e = e[:4]
		}
		return e + " " + lzModel.DescribeOperation(input, output)
	}
	return m
}

// lzEpochAcked records in s what an acknowledged write of in did.
func lzEpochAcked(s lzEpochState, in lzInput, out lzOutput) []any {
	if out.unknown || out.conflict {
		return []any{s}
	}
	switch in.op {
	case "put", "cas":
		s.acked, s.wasDel = out.modRev, false
	case "del":
		s.acked, s.wasDel = 0, true
	}
	return []any{s}
}

// TestLinearizableRedis: 6 clients over 3 nodes on one redis-server.
func TestLinearizableRedis(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, mnOptions{})
	var urls []string
	for _, n := range c.nodes {
		urls = append(urls, n.HTTP())
	}
	lzRun(t, urls, "", 6, 150, nil)
}

// TestLinearizableRedisOneNode: the same on a single node.
func TestLinearizableRedisOneNode(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 1, mnOptions{})
	lzRun(t, []string{c.nodes[0].HTTP()}, "", 6, 150, nil)
}

// TestLinearizableFileMemory: the same on one node of the file store and
// one of the memory store.
func TestLinearizableFileMemory(t *testing.T) {
	t.Parallel()
	statecastBin(t)
	for _, st := range []string{"file", "memory"} {
		t.Run(st, func(t *testing.T) {
			n := &mnNode{name: st, redisURL: st, extra: []string{"--data", t.TempDir()}}
			n.start(t)
			t.Cleanup(n.kill)
			lzRun(t, []string{n.HTTP()}, "", 6, 150, nil)
		})
	}
}

// TestLinearizableFileKills: the same check on one node of the file store
// SIGKILLed and restarted on its data four times: every write it answered
// was in its write-ahead log, and recovery brings back no more and no less.
func TestLinearizableFileKills(t *testing.T) {
	t.Parallel()
	statecastBin(t)
	n := &mnNode{name: "file", redisURL: "file", extra: []string{"--data", t.TempDir()}}
	n.start(t)
	t.Cleanup(n.kill)
	lzRun(t, []string{n.HTTP()}, "", 6, 0, func(ctx context.Context) {
		for range 4 {
			pause(ctx, time.Duration(200+rand.IntN(400))*time.Millisecond)
			if ctx.Err() != nil {
				return
			}
			n.kill()
			if err := n.restart(); err != nil {
				t.Errorf("restarting the node: %v", err)
				return
			}
		}
		pause(ctx, 400*time.Millisecond) // operations after the last restart, too
	})
}

// TestLinearizableRedisFaults: the same check on 3 nodes while, one after
// another, a node is killed (SIGKILL) and restarted, a node's Redis
// connection is cut and restored, and Redis itself is killed and
// restarted from its AOF (appendfsync always: no acknowledged write lost):
// each twice, in random order.
func TestLinearizableRedisFaults(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, mnOptions{AOF: true, Proxied: true})
	lzRun(t, c.httpURLs(), "", 6, 0, func(ctx context.Context) { lzFaults(ctx, t, c, 2) })
}

// TestLinearizableSoak runs the faulted check in rounds for -soak
// (make soak), each round on fresh keys.
func TestLinearizableSoak(t *testing.T) {
	d := soakDuration(t)
	c := startCluster(t, 3, mnOptions{AOF: true, Proxied: true})
	rounds := 0
	for end := time.Now().Add(d); time.Now().Before(end); rounds++ {
		lzRun(t, c.httpURLs(), fmt.Sprintf("r%d/", rounds), 6, 0, func(ctx context.Context) { lzFaults(ctx, t, c, 1) })
	}
	t.Logf("%d rounds linearizable", rounds)
}

// lzFaults injects each kind of fault times times, in random order, with
// a pause before each and after the last. It runs beside the test's
// goroutine, so it reports with Errorf, never Fatal.
func lzFaults(ctx context.Context, t *testing.T, c *mnCluster, times int) {
	pause := func(lo, hi int) bool { return lzPause(ctx, lo, hi) }
	var script []int
	for range times {
		script = append(script, 0, 1, 2)
	}
	rand.Shuffle(len(script), func(i, j int) { script[i], script[j] = script[j], script[i] })
	faults := map[string]int{}
	defer func() { t.Logf("faults: %v", faults) }()
	defer pause(200, 600) // operations after the last fault, too
	for _, f := range script {
		if !pause(200, 600) {
			return
		}
		faults[[]string{"node killed", "Redis cut", "Redis restarted"}[f]]++
		switch f {
		case 0:
			n := c.nodes[rand.IntN(len(c.nodes))]
			n.kill()
			pause(0, 800)
			if err := n.restart(); err != nil {
				t.Errorf("restarting node %s: %v", n.name, err)
				return
			}
		case 1:
			p := c.proxies[rand.IntN(len(c.proxies))]
			p.Cut()
			pause(300, 1500)
			p.Restore()
		case 2:
			c.redis.Kill()
			pause(0, 500)
			if err := c.redis.StartAgain(); err != nil {
				t.Errorf("restarting redis-server: %v", err)
				return
			}
		}
	}
}

// lzPause waits lo to hi milliseconds (at random); false when ctx ended
// first.
func lzPause(ctx context.Context, lo, hi int) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Duration(lo+rand.IntN(hi-lo)) * time.Millisecond):
		return true
	}
}
