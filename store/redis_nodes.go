package store

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The node registry is one sorted set, <prefix>:nodes, of node -> last
// beat (unix ms). Claim is a script so that "still stale" and the removal
// are one step: a node that beat again meanwhile is not claimed.

var _ Nodes = (*Redis)(nil)

var claimScript = redis.NewScript(`
local t = redis.call('ZSCORE', KEYS[1], ARGV[1])
if t and tonumber(t) < tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0`)

func (s *Redis) nodesKey() string { return s.cfg.Prefix + ":nodes" }

// Beat records that node is alive at now.
func (s *Redis) Beat(ctx context.Context, node string, now time.Time) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return s.rc.ZAdd(ctx, s.nodesKey(), redis.Z{Score: float64(now.UnixMilli()), Member: node}).Err()
}

// Beats returns every registered node with its last beat.
func (s *Redis) Beats(ctx context.Context) (map[string]time.Time, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	zs, err := s.rc.ZRangeWithScores(ctx, s.nodesKey(), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]time.Time, len(zs))
	for _, z := range zs {
		if m, ok := z.Member.(string); ok {
			out[m] = time.UnixMilli(int64(z.Score))
		}
	}
	return out, nil
}

// Claim removes node if its last beat is before the given time; true for
// exactly one of the callers racing for it.
func (s *Redis) Claim(ctx context.Context, node string, before time.Time) (bool, error) {
	if err := s.begin(); err != nil {
		return false, err
	}
	defer s.mu.RUnlock()
	n, err := claimScript.Run(ctx, s.rc, []string{s.nodesKey()}, node, strconv.FormatInt(before.UnixMilli(), 10)).Int()
	return n == 1, err
}
