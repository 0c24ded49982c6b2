package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/internal/groupcommit"
)

// Group commit: the concurrent Apply calls of a store go to Redis
// together, one pipeline per master and round trip
// (docs/DESIGN.md#several-nodes-on-redis). Each master has a committer:
// one goroutine that takes whatever writes are queued when it is free (up
// to maxGroupWrites or maxGroupBytes), sends them in one pipeline, and
// answers each. An idle committer sends a write at once; writes that
// arrive while a round trip is in flight go in the next one. The pipeline
// holds one apply.lua call per room, with that room's writes in queue
// order; each write is still its own revision with its own conditions.

const (
	maxGroupWrites = 128
	maxGroupBytes  = 1 << 20
	queueLen       = 1024
)

// req is one Apply waiting for its committer.
type req struct {
	room      string
	keys      []string // the room's: meta, kv, log, wids
	maxEvents int      // the room's retention
	cut, ch   string   // age cutoff at the write's time, channel
	args      []any    // the write's arguments of apply.lua
	size      int      // bytes it adds to a pipeline
	state     groupcommit.Handover
	done      chan struct{}

	// Set by the committer before done is closed.
	reply []any // the script's reply; nil when err is set
	err   error // why there is no reply (writeErr)
}

func (r *req) bytes() int { return r.size }

// committer sends the writes of one master.
type committer struct {
	s    *Store
	node *redis.Client // the standalone server, or one cluster master
	q    chan *req
}

// committerFor returns the committer of the master serving key (started
// on first use; it ends when the store closes).
func (s *Store) committerFor(ctx context.Context, key string) (*committer, error) {
	node, ok := s.wc.(*redis.Client)
	if !ok {
		var err error
		if node, err = s.wc.(*redis.ClusterClient).MasterForKey(ctx, key); err != nil {
			return nil, err
		}
	}
	s.cmu.Lock()
	defer s.cmu.Unlock()
	c := s.committers[node]
	if c == nil {
		c = &committer{s: s, node: node, q: make(chan *req, queueLen)}
		s.committers[node] = c
		s.wg.Add(1)
		go c.run()
	}
	return c, nil
}

// submit queues r on the committer of its room and waits for the reply.
// A write still queued when ctx ends or WriteTimeout passes was not sent:
// it is dropped and reported unavailable. One already taken has an
// unknown outcome once its caller stops waiting.
func (s *Store) submit(ctx context.Context, r *req) ([]any, error) {
	c, err := s.committerFor(ctx, r.keys[0])
	if err != nil {
		return nil, fmt.Errorf("%w: redis write to room %q: %v", store.ErrUnavailable, r.room, err)
	}
	bound := time.NewTimer(s.cfg.WriteTimeout)
	defer bound.Stop()
	var stop error
	select {
	case c.q <- r:
		select {
		case <-r.done:
			return r.reply, r.err
		case <-ctx.Done():
			stop = ctx.Err()
		case <-bound.C:
			stop = context.DeadlineExceeded
		}
		if !r.state.Abandon() {
			return nil, fmt.Errorf("store: redis write to room %q (outcome unknown): %w", r.room, stop)
		}
	case <-ctx.Done():
		stop = ctx.Err()
	case <-bound.C:
		stop = context.DeadlineExceeded
	}
	return nil, fmt.Errorf("%w: redis write to room %q not sent: %w", store.ErrUnavailable, r.room, stop)
}

// run is the committer's loop: it gathers whatever is queued into one
// group and sends it, until the store closes (Close waits for every Apply
// first, so nothing is left queued).
func (c *committer) run() {
	defer c.s.wg.Done()
	group := make([]*req, 0, maxGroupWrites)
	for {
		var first *req
		select {
		case <-c.s.ctx.Done():
			return
		case first = <-c.q:
		}
		if h := c.s.hookGroup.Load(); h != nil {
			(*h)()
		}
		group = groupcommit.Fill(append(group[:0], first), c.q, maxGroupWrites, maxGroupBytes, (*req).bytes)
		c.send(group)
		clear(group)
	}
}

// call is one apply.lua call: the writes of one room in a group.
type call struct {
	rs   []*req
	args []any
	cmd  *redis.Cmd
}

// send runs the live writes of group in one pipeline, one call per room,
// and answers each. NOSCRIPT ran nothing: those calls are sent again with
// the script's text (EVAL), once.
func (c *committer) send(group []*req) {
	var calls []*call
	byRoom := map[string]*call{}
	for _, r := range group {
		if !r.state.Take() {
			continue // abandoned by its caller
		}
		cl := byRoom[r.room]
		if cl == nil {
			cl = &call{}
			byRoom[r.room] = cl
			calls = append(calls, cl)
		}
		cl.rs = append(cl.rs, r)
	}
	if len(calls) == 0 {
		return
	}
	for _, cl := range calls {
		last := cl.rs[len(cl.rs)-1] // the newest age cutoff
		n := 6
		for _, r := range cl.rs {
			n += len(r.args)
		}
		cl.args = make([]any, 0, n)
		cl.args = append(cl.args, store.NewEpoch(), last.maxEvents, last.cut, last.ch, metaTTL.Milliseconds(), len(cl.rs))
		for _, r := range cl.rs {
			cl.args = append(cl.args, r.args...)
		}
	}
	ctx, cancel := context.WithTimeout(c.s.ctx, c.s.cfg.WriteTimeout)
	defer cancel()
	c.pipeline(ctx, calls, func(p redis.Pipeliner, cl *call) *redis.Cmd {
		return applyScript.EvalSha(ctx, p, cl.rs[0].keys, cl.args...)
	})
	var again []*call
	for _, cl := range calls {
		if cl.cmd.Val() == nil && redis.HasErrorPrefix(cl.cmd.Err(), "NOSCRIPT") {
			again = append(again, cl)
		}
	}
	if len(again) > 0 {
		c.pipeline(ctx, again, func(p redis.Pipeliner, cl *call) *redis.Cmd {
			return applyScript.Eval(ctx, p, cl.rs[0].keys, cl.args...)
		})
	}
	moved := false
	for _, cl := range calls {
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
			}
			close(r.done)
		}
	}
	if moved {
		if cl, ok := c.s.wc.(*redis.ClusterClient); ok {
			cl.ReloadState(ctx) // the next writes go to the slot's new master
		}
	}
}

// pipeline sends calls in one round trip, setting each one's cmd.
func (c *committer) pipeline(ctx context.Context, calls []*call, cmd func(redis.Pipeliner, *call) *redis.Cmd) {
	_, _ = c.node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, cl := range calls {
			cl.cmd = cmd(p, cl)
		}
		return nil
	})
}

// outcome is a write's reply, or the error that took its place. When a
// pipeline breaks while its replies are read, go-redis sets the failure on
// every command, also on those whose reply had arrived; a reply that
// arrived is the outcome.
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
