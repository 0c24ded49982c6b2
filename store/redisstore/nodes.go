package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
)

// The node registry is one sorted set, <prefix>:nodes, of node -> last
// beat in unix ms of the Redis server's clock (TIME), so a node whose
// clock runs behind is not taken for dead. Claim is a script so that
// "still stale" and the removal are one step: a node that beat again
// meanwhile is not claimed. A turn is a string, <prefix>:turn:<name>,
// holding its node until it expires.

var _ store.Nodes = (*Store)(nil)

// redisNow is the Redis server's time in unix ms, inside a script.
const redisNow = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

// redisClockID names the clock now was read from: the Redis process's
// run_id, which a failover changes (empty where INFO is refused).
const redisClockID = `local clock = ''
local info = redis.pcall('INFO', 'server')
if type(info) == 'string' then clock = string.match(info, 'run_id:(%x+)') or '' end
`

var (
	// beat returns {added, now, clock}.
	beatScript = redis.NewScript(redisNow + redisClockID + `return {redis.call('ZADD', KEYS[1], now, ARGV[1]), now, clock}`)
	// registered returns {now, clock, node, beat, node, beat, ...}.
	registeredScript = redis.NewScript(redisNow + redisClockID + `
local out = {now, clock}
local z = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #z do out[#out + 1] = z[i] end
return out`)
	claimScript = redis.NewScript(redisNow + `
local b = redis.call('ZSCORE', KEYS[1], ARGV[1])
if b and tonumber(b) < now - tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0`)
)

// registryPool: the connections of the registry's client (a beat and a
// read at a time, and a claim).
const registryPool = 3

// commitPool: the connections of the committers' client (one round trip
// at a time per master, and one dialled while a broken one closes).
const commitPool = 2

func (s *Store) nodesKey() string { return s.cfg.Prefix + ":nodes" }

// Beat records that node is alive now.
func (s *Store) Beat(ctx context.Context, node string) (store.BeatResult, error) {
	if err := s.begin(); err != nil {
		return store.BeatResult{}, err
	}
	defer s.mu.RUnlock()
	sent := time.Now()
	v, err := beatScript.Run(ctx, s.hc, []string{s.nodesKey()}, node).Slice()
	if err != nil || len(v) != 3 {
		return store.BeatResult{}, err
	}
	added, _ := v[0].(int64)
	now, _ := v[1].(int64)
	clock, _ := v[2].(string)
	res := store.BeatResult{Added: added == 1}
	if ms, id, ok := s.clock.mapped(sent); ok && id == clock { // by the samples before this one
		res.Reached = time.Duration(max(now-ms, 0)) * time.Millisecond
	}
	s.clock.sample(sent, time.Now(), now, clock)
	return res, nil
}

// Registered splits the registered nodes into those that beat within
// timeout and the others.
func (s *Store) Registered(ctx context.Context, timeout time.Duration) (alive, stale []string, err error) {
	if err := s.begin(); err != nil {
		return nil, nil, err
	}
	defer s.mu.RUnlock()
	sent := time.Now()
	v, err := registeredScript.Run(ctx, s.hc, []string{s.nodesKey()}).Slice()
	if err != nil || len(v) == 0 {
		return nil, nil, err
	}
	now, _ := v[0].(int64)
	clock, _ := v[1].(string)
	s.clock.sample(sent, time.Now(), now, clock)
	for i := 2; i+1 < len(v); i += 2 {
		node, _ := v[i].(string)
		beat, _ := v[i+1].(string)
		ms, perr := parseScore(beat)
		if perr == nil && ms >= now-timeout.Milliseconds() {
			alive = append(alive, node)
		} else {
			stale = append(stale, node)
		}
	}
	return alive, stale, nil
}

// Claim removes node if it is still stale; true for at most one of the
// callers racing for it. It runs on the write client, which never
// retries: a retry after a lost reply would find the node gone and tell
// every caller no.
func (s *Store) Claim(ctx context.Context, node string, timeout time.Duration) (bool, error) {
	if err := s.begin(); err != nil {
		return false, err
	}
	defer s.mu.RUnlock()
	n, err := s.runWrite(ctx, claimScript, []string{s.nodesKey()}, node, timeout.Milliseconds()).Int()
	return n == 1, err
}

// TakeTurn sets the turn if no node holds it (SET NX PX). It runs on
// the write client, which never retries: a retry after a lost reply
// would find the turn taken, by this node, and say no. Either way that
// interval's work is skipped.
func (s *Store) TakeTurn(ctx context.Context, name, node string, ttl time.Duration) (bool, error) {
	if err := s.begin(); err != nil {
		return false, err
	}
	defer s.mu.RUnlock()
	return s.wc.SetNX(ctx, s.cfg.Prefix+":turn:"+name, node, ttl).Result()
}

// parseScore reads a sorted-set score as Redis returns it to a script
// (a string; integral here, maybe in exponent form).
func parseScore(s string) (int64, error) {
	f, err := strconv.ParseFloat(s, 64)
	return int64(f), err
}
