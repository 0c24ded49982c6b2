package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/internal/groupcommit"
)

// Group commit: the concurrent Apply calls of a store go to Redis
// together, one pipeline per master and round trip
// (docs/DESIGN.md#several-nodes-on-redis). Each master has a committer
// with at most one round trip in flight. A write that finds it idle is
// sent at once, by its own goroutine (no hand-over, no linger); writes
// that arrive while a round trip is in flight queue, and the committer's
// goroutine sends whatever is queued (up to maxGroupWrites or
// maxGroupBytes) in the next one. The pipeline holds one apply.lua call
// per room, with that room's writes in queue order; each write is still
// its own revision with its own conditions. A record's script that a
// client's connect waits for (a session's save, take, detach, key
// listing: runRecord) rides in the same round trips as a call of its
// own: a burst of connects costs a round trip per group, not a pooled
// connection each (one each ran the pool out, and every connect past it
// failed on the pool's timeout).

const (
	maxGroupWrites = 128
	maxGroupBytes  = 1 << 20
)

// req is one Apply, or one record's script, waiting for its committer.
type req struct {
	room      string   // "" for a record's script
	keys      []string // the room's: meta, kv, log, wids; or the script's
	maxEvents int      // the room's retention
	maxBytes  int64
	cut, ch   string // age cutoff at the write's time, channel
	args      []any  // the write's arguments of apply.lua
	size      int    // bytes it adds to a pipeline
	state     groupcommit.Handover
	done      chan struct{}

	// script, for a record's script (runRecord), is run with keys and
	// args as a call of its own; its reply is cmd.
	script *redis.Script

	// Set by the committer before done is closed.
	reply []any      // the script's reply; nil when err is set
	err   error      // why there is no reply (writeErr)
	cmd   *redis.Cmd // a record script's command, its reply or error
}

// what names r in errors.
func (r *req) what() string {
	if r.script != nil {
		return "a record"
	}
	return fmt.Sprintf("room %q", r.room)
}

// committer sends the writes of one master.
type committer struct {
	s    *Store
	node *redis.Client // the standalone server, or one cluster master
	kick chan struct{} // (1) writes are queued and no round trip is in flight

	mu    sync.Mutex // guards queue and busy
	queue []*req     // as long as the writers waiting: one per Apply call
	busy  bool       // a round trip is in flight
}

// committerFor returns the committer of the master serving key (started
// on first use; it ends when the store closes).
func (s *Store) committerFor(ctx context.Context, key string) (*committer, error) {
	node, ok := s.cc.(*redis.Client)
	if !ok {
		var err error
		if node, err = s.cc.(*redis.ClusterClient).MasterForKey(ctx, key); err != nil {
			return nil, err
		}
	}
	s.cmu.Lock()
	defer s.cmu.Unlock()
	c := s.committers[node]
	if c == nil {
		c = &committer{s: s, node: node, kick: make(chan struct{}, 1)}
		s.committers[node] = c
		s.wg.Add(1)
		go c.run()
	}
	return c, nil
}

// submit sends r, or queues it on its master's committer, and waits for
// the reply. A write still queued when ctx ends or WriteTimeout passes
// was not sent: it is dropped and reported unavailable. One already taken
// has an unknown outcome once its caller stops waiting.
func (s *Store) submit(ctx context.Context, r *req) ([]any, error) {
	c, err := s.committerFor(ctx, r.keys[0])
	if err != nil {
		return nil, fmt.Errorf("%w: redis write to %s: %v", store.ErrUnavailable, r.what(), err)
	}
	c.mu.Lock()
	if !c.busy && len(c.queue) == 0 {
		c.busy = true
		c.mu.Unlock()
		r.state.Take()
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if !endsWithin(ctx, s.cfg.WriteTimeout) {
			wctx, cancel = context.WithTimeout(ctx, s.cfg.WriteTimeout)
		}
		c.send(wctx, []*req{r})
		cancel()
		c.idle()
		return r.reply, r.err
	}
	c.queue = append(c.queue, r)
	c.mu.Unlock()
	var bound <-chan time.Time
	if !endsWithin(ctx, s.cfg.WriteTimeout) {
		t := time.NewTimer(s.cfg.WriteTimeout)
		defer t.Stop()
		bound = t.C
	}
	var stop error
	select {
	case <-r.done:
		return r.reply, r.err
	case <-ctx.Done():
		stop = ctx.Err()
	case <-bound:
		stop = context.DeadlineExceeded
	}
	if !r.state.Abandon() {
		return nil, fmt.Errorf("store: redis write to %s (outcome unknown): %w", r.what(), stop)
	}
	return nil, fmt.Errorf("%w: redis write to %s not sent: %w", store.ErrUnavailable, r.what(), stop)
}

// runRecord runs a record's script as runWrite does, in the next round
// trip of the keys' master's committer. Still queued when ctx ends or
// WriteTimeout passes, it is not sent (store.ErrUnavailable).
func (s *Store) runRecord(ctx context.Context, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	size := 64
	for _, k := range keys {
		size += len(k)
	}
	for _, a := range args {
		if v, ok := a.(string); ok {
			size += len(v)
		} else {
			size += 16
		}
	}
	r := &req{keys: keys, script: sc, args: args, size: size, done: make(chan struct{})}
	if _, err := s.submit(ctx, r); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	if err := r.cmd.Err(); err != nil && notSent(err) {
		r.cmd.SetErr(fmt.Errorf("%w: redis write to %s: %w", store.ErrUnavailable, r.what(), err))
	}
	return r.cmd
}

// endsWithin reports whether ctx has a deadline within d from now: then
// it bounds a write as WriteTimeout would, without a timer of the write's
// own (the server's writes carry their StoreTimeout so).
func endsWithin(ctx context.Context, d time.Duration) bool {
	dl, ok := ctx.Deadline()
	return ok && time.Until(dl) <= d
}

// idle ends a round trip; the committer's goroutine sends what queued
// meanwhile.
func (c *committer) idle() {
	c.mu.Lock()
	c.busy = false
	if len(c.queue) > 0 {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	c.mu.Unlock()
}

// run is the committer's goroutine: it sends what is queued, a group per
// round trip, until the store closes (Close waits for every Apply first,
// so nothing is left queued).
func (c *committer) run() {
	defer c.s.wg.Done()
	var group []*req
	for {
		select {
		case <-c.s.ctx.Done():
			return
		case <-c.kick:
		}
		for {
			c.mu.Lock()
			if c.busy || len(c.queue) == 0 {
				c.mu.Unlock()
				break // the round trip in flight kicks again when it ends
			}
			c.busy = true
			n, size := 0, 0
			for n < len(c.queue) && n < maxGroupWrites && (n == 0 || size < maxGroupBytes) {
				size += c.queue[n].size
				n++
			}
			group = append(group[:0], c.queue[:n]...)
			c.queue = append(c.queue[:0], c.queue[n:]...)
			c.mu.Unlock()
			live := group[:0]
			for _, r := range group {
				if r.state.Take() { // else abandoned by its caller
					live = append(live, r)
				}
			}
			if len(live) > 0 {
				ctx, cancel := context.WithTimeout(c.s.ctx, c.s.cfg.WriteTimeout)
				c.send(ctx, live)
				cancel()
			}
			clear(group)
			c.mu.Lock()
			c.busy = false
			c.mu.Unlock()
		}
	}
}

// buildArgs sets the arguments of each apply.lua call (see its header),
// for the Redis process the committer's connections reach now.
func (c *committer) buildArgs(ctx context.Context, calls []*call) {
	quota := c.s.cfg.Limits.WithDefaults()
	run, lossless := c.s.buildFor(ctx, c.node)
	for _, cl := range calls {
		if cl.script != applyScript {
			continue
		}
		last := cl.rs[len(cl.rs)-1] // the newest age cutoff
		n := 11
		for _, r := range cl.rs {
			n += len(r.args)
		}
		cl.args = make([]any, 0, n)
		cl.args = append(cl.args, store.NewEpoch(), last.maxEvents, last.cut, last.ch, metaTTL.Milliseconds(), last.maxBytes, len(cl.rs),
			quota.MaxRoomKeys, quota.MaxRoomBytes, lossless, run)
		for _, r := range cl.rs {
			cl.args = append(cl.args, r.args...)
		}
	}
}

// call is one script call: apply.lua with the writes of one room in a
// group, or a record's script (one req).
type call struct {
	rs     []*req
	script *redis.Script
	args   []any
	cmd    *redis.Cmd
}

// send runs writes, all taken, in one pipeline, one call per room, and
// answers each. NOSCRIPT ran nothing: those calls are sent again with the
// script's text (EVAL), once.
func (c *committer) send(ctx context.Context, writes []*req) {
	if h := c.s.hookGroup.Load(); h != nil {
		(*h)()
	}
	var calls []*call
	byRoom := map[string]*call{}
	for _, r := range writes {
		if r.script != nil {
			calls = append(calls, &call{rs: []*req{r}, script: r.script, args: r.args})
			continue
		}
		cl := byRoom[r.room]
		if cl == nil {
			cl = &call{script: applyScript}
			byRoom[r.room] = cl
			calls = append(calls, cl)
		}
		cl.rs = append(cl.rs, r)
	}
	var wait *redis.Cmd
	// A connection refused for reaching a new Redis process sent nothing:
	// the writes are built again for that process (restart.go).
	for try := 0; ; try++ {
		c.buildArgs(ctx, calls)
		wait = c.pipeline(ctx, calls, func(p redis.Pipeliner, cl *call) *redis.Cmd {
			return cl.script.EvalSha(ctx, p, cl.rs[0].keys, cl.args...)
		})
		if try == 2 || !errors.Is(calls[0].cmd.Err(), errNewProcess) {
			break
		}
	}
	var again []*call
	for _, cl := range calls {
		if cl.cmd.Val() == nil && redis.HasErrorPrefix(cl.cmd.Err(), "NOSCRIPT") {
			again = append(again, cl)
		}
	}
	if len(again) > 0 {
		wait = c.pipeline(ctx, again, func(p redis.Pipeliner, cl *call) *redis.Cmd {
			return cl.script.Eval(ctx, p, cl.rs[0].keys, cl.args...)
		})
	}
	unreplicated := c.s.unreplicated(wait)
	moved := false
	for _, cl := range calls {
		if r := cl.rs[0]; r.script != nil { // as runWrite answers it
			if cl.cmd.Err() == nil && unreplicated != nil {
				cl.cmd.SetErr(unreplicated)
			}
			moved = moved || redirected(cl.cmd.Err())
			r.cmd = cl.cmd
			close(r.done)
			continue
		}
		replies, err := outcome(cl.cmd)
		if err == nil && len(replies) != len(cl.rs) {
			err = fmt.Errorf("%d replies to %d writes", len(replies), len(cl.rs))
		}
		moved = moved || redirected(err)
		for i, r := range cl.rs {
			if err != nil {
				r.err = writeErr(r.room, err)
			} else if r.reply, _ = replies[i].([]any); r.reply == nil {
				r.err = writeErr(r.room, fmt.Errorf("unexpected reply %v", replies[i]))
			} else if unreplicated != nil && acknowledges(r.reply) {
				r.reply, r.err = nil, writeErr(r.room, unreplicated)
			}
			close(r.done)
		}
	}
	if moved {
		if cl, ok := c.s.cc.(*redis.ClusterClient); ok {
			cl.ReloadState(ctx) // the next writes go to the slot's new master
		}
	}
}

// pipeline sends calls in one round trip, setting each one's cmd. With
// MinReplicas, the round trip ends with a PUBLISH and WAIT, whose command
// it returns (else nil): WAIT waits for the replicas to reach this
// connection's last write, and the PUBLISH, which is replicated, makes
// that the master's whole history so far, so that replies that wrote
// nothing (a duplicate write id, a no-op) are covered too (not in a
// Cluster: there WAIT covers the connection's last write only).
func (c *committer) pipeline(ctx context.Context, calls []*call, cmd func(redis.Pipeliner, *call) *redis.Cmd) (wait *redis.Cmd) {
	n := c.s.cfg.MinReplicas
	_, _ = c.node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, cl := range calls {
			cl.cmd = cmd(p, cl)
		}
		if n > 0 {
			if c.s.cluster == nil { // a cluster would send it to every node, not replicate it
				p.Publish(ctx, c.s.cfg.Prefix+":replicated", "")
			}
			wait = p.Do(ctx, "WAIT", n, c.s.cfg.ReplicaTimeout.Milliseconds())
		}
		return nil
	})
	return wait
}

// unreplicated says why the writes of a round trip ended by wait are not
// acknowledged (fewer replicas than MinReplicas confirmed them in time),
// or nil when they are (or nothing was waited for).
func (s *Store) unreplicated(wait *redis.Cmd) error {
	if wait == nil {
		return nil
	}
	n, err := wait.Int64()
	if err != nil {
		return fmt.Errorf("committed on the master; waiting for %d replicas failed: %w", s.cfg.MinReplicas, err)
	}
	if n < int64(s.cfg.MinReplicas) {
		return fmt.Errorf("committed on the master, but %d of the %d replicas required confirmed it within %v", n, s.cfg.MinReplicas, s.cfg.ReplicaTimeout)
	}
	return nil
}

// acknowledges reports whether apply.lua's reply to one write tells its
// client that the write is committed (OK, DUP, NOOP), which MinReplicas
// makes wait for the replicas; a refusal wrote nothing.
func acknowledges(reply []any) bool {
	st, _ := reply[0].(string)
	return st == "OK" || st == "DUP" || st == "NOOP"
}

// outcome is a call's reply (one per write), or the error that took its
// place. When a pipeline breaks while its replies are read, go-redis sets
// the failure on every command, also on those whose reply had arrived: a
// reply that arrived is the outcome.
func outcome(cmd *redis.Cmd) ([]any, error) {
	if v, ok := cmd.Val().([]any); ok {
		return v, nil
	}
	if err := cmd.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("unexpected reply %v", cmd.Val())
}

// redirected reports a cluster reply that refused a command because its
// slot is served elsewhere.
func redirected(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	return strings.HasPrefix(re.Error(), "MOVED ") || strings.HasPrefix(re.Error(), "ASK ")
}

// runWrite runs a script that changes a record (a session's, a lease's,
// the node registry's) on the write client. With MinReplicas the same
// round trip ends with WAIT, as a room write's does: a change that fewer
// replicas confirmed in time is reported as of unknown outcome, as a lost
// reply is.
func (s *Store) runWrite(ctx context.Context, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	if s.cfg.MinReplicas == 0 {
		return sc.Run(ctx, s.wc, keys, args...)
	}
	var node redis.Cmdable = s.wc
	if cl, ok := s.wc.(*redis.ClusterClient); ok { // WAIT goes to the keys' master
		m, err := cl.MasterForKey(ctx, keys[0])
		if err != nil {
			cmd := redis.NewCmd(ctx)
			cmd.SetErr(err)
			return cmd
		}
		node = m
	}
	var cmd, wait *redis.Cmd
	send := func(eval bool) {
		_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			if eval {
				cmd = sc.Eval(ctx, p, keys, args...)
			} else {
				cmd = sc.EvalSha(ctx, p, keys, args...)
			}
			wait = p.Do(ctx, "WAIT", s.cfg.MinReplicas, s.cfg.ReplicaTimeout.Milliseconds())
			return nil
		})
	}
	send(false)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		send(true)
	}
	if cmd.Err() == nil {
		if err := s.unreplicated(wait); err != nil {
			cmd.SetErr(err)
		}
	}
	return cmd
}
