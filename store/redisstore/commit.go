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
// together, one pipeline of apply.lua calls per master and round trip
// (docs/DESIGN.md#several-nodes-on-redis). Each master has a committer:
// one goroutine that takes whatever writes are queued when it is free (up
// to maxGroupWrites or maxGroupBytes), sends them in one pipeline, and
// answers each. An idle committer sends a write at once; writes that
// arrive while a round trip is in flight go in the next one. Every write
// is still its own script call: its own revision, its own conditions.

const (
	maxGroupWrites = 128
	maxGroupBytes  = 1 << 20
	queueLen       = 1024
)

// req is one Apply waiting for its committer.
type req struct {
	room  string
	keys  []string
	args  []any
	size  int // bytes it adds to a pipeline
	state groupcommit.Handover
	done  chan struct{}

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

// send runs the live writes of group in one pipeline and answers each.
// NOSCRIPT ran nothing: those writes are sent again with the script's
// text (EVAL), once.
func (c *committer) send(group []*req) {
	live := group[:0:0]
	for _, r := range group {
		if r.state.Take() {
			live = append(live, r)
		}
	}
	if len(live) == 0 {
		return // every write was abandoned by its caller
	}
	ctx, cancel := context.WithTimeout(c.s.ctx, c.s.cfg.WriteTimeout)
	defer cancel()
	cmds := make([]*redis.Cmd, len(live))
	c.pipeline(ctx, live, cmds, func(p redis.Pipeliner, r *req) *redis.Cmd {
		return applyScript.EvalSha(ctx, p, r.keys, r.args...)
	})
	var again []*req
	var againAt []int
	for i, cmd := range cmds {
		if cmd.Val() == nil && redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			again = append(again, live[i])
			againAt = append(againAt, i)
		}
	}
	if len(again) > 0 {
		cmds2 := make([]*redis.Cmd, len(again))
		c.pipeline(ctx, again, cmds2, func(p redis.Pipeliner, r *req) *redis.Cmd {
			return applyScript.Eval(ctx, p, r.keys, r.args...)
		})
		for j, i := range againAt {
			cmds[i] = cmds2[j]
		}
	}
	moved := false
	for i, r := range live {
		var err error
		r.reply, err = outcome(cmds[i])
		if err != nil {
			moved = moved || redirected(err)
			r.err = writeErr(r.room, err)
		}
		close(r.done)
	}
	if moved {
		if cl, ok := c.s.wc.(*redis.ClusterClient); ok {
			cl.ReloadState(ctx) // the next writes go to the slot's new master
		}
	}
}

// pipeline sends one command per write in one round trip; cmds[i] is the
// command of rs[i].
func (c *committer) pipeline(ctx context.Context, rs []*req, cmds []*redis.Cmd, cmd func(redis.Pipeliner, *req) *redis.Cmd) {
	_, _ = c.node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range rs {
			cmds[i] = cmd(p, r)
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
