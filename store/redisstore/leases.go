package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
)

// TTL leases on Redis. Every key under one hash tag, {leases}, so that
// each script stays in one slot of a Redis Cluster:
//
//	<prefix>:{leases}:rec      HASH  id -> {"holder","ttl_ms"}
//	<prefix>:{leases}:due      ZSET  id -> deadline (unix ms, Redis clock)
//	<prefix>:{leases}:held     HASH  holder -> leases held
//	<prefix>:{leases}:k:<id>   HASH  room NUL key -> mod_rev written under the lease
//	<prefix>:{leases}:ended    SET   ids whose keys are still being deleted
//
// A lease is alive while its record exists and its deadline is ahead.
// Ending one (revoke, or the deadline) moves its id from rec to ended in
// one script; the node that ended it deletes its keys, then forgets the
// list. A node that dies half-way leaves the id in ended for any node
// to finish (EndedLeaseKeys). Scripts run on the write client, which
// never retries.

var _ store.SharedLeases = (*Store)(nil)

const leaseScriptHead = redisNow + `
local function alive(id)
  local v = redis.call('HGET', KEYS[1], id)
  if not v then return nil end
  local d = redis.call('ZSCORE', KEYS[2], id)
  if not d or tonumber(d) <= now then return nil end
  return cjson.decode(v)
end
local function finish(id, r)
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  if r.holder and redis.call('HINCRBY', KEYS[3], r.holder, -1) <= 0 then redis.call('HDEL', KEYS[3], r.holder) end
  redis.call('SADD', KEYS[4], id)
end
`

var (
	// All take KEYS rec, due, held, ended and ARGV[1] the key-list prefix;
	// those reading a lease return {0} when it is not alive, else {1,
	// holder, ttl ms, ...} (an anonymous holder is "").
	// grant: ARGV id, holder, ttl ms, max.
	grantLeaseScript = redis.NewScript(leaseScriptHead + `
if tonumber(redis.call('HGET', KEYS[3], ARGV[3]) or '0') >= tonumber(ARGV[5]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], cjson.encode({holder = ARGV[3], ttl_ms = tonumber(ARGV[4])}))
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[2])
redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
return 1`)
	// keepAlive: ARGV id, holder.
	keepAliveLeaseScript = redis.NewScript(leaseScriptHead + `
local r = alive(ARGV[2])
if not r then return {0} end
if r.holder == ARGV[3] then redis.call('ZADD', KEYS[2], now + r.ttl_ms, ARGV[2]) end
return {1, r.holder, r.ttl_ms}`)
	// lease: ARGV id.
	leaseScript = redis.NewScript(leaseScriptHead + `
local r = alive(ARGV[2])
if not r then return {0} end
return {1, r.holder, r.ttl_ms}`)
	// revoke: ARGV id, holder. Returns {1, holder, ttl ms, keys} when revoked.
	revokeLeaseScript = redis.NewScript(leaseScriptHead + `
local r = alive(ARGV[2])
if not r then return {0} end
if r.holder ~= ARGV[3] then return {1, r.holder, r.ttl_ms} end
finish(ARGV[2], r)
return {1, r.holder, r.ttl_ms, redis.call('HGETALL', ARGV[1] .. ARGV[2])}`)
	// attach: ARGV id, room NUL key, mod_rev. A key written twice under
	// the lease keeps its later revision, whatever order the attaches
	// arrive in (decimal strings: longer is larger, else compare).
	attachLeaseScript = redis.NewScript(leaseScriptHead + `
if not alive(ARGV[2]) then return 0 end
local cur = redis.call('HGET', ARGV[1] .. ARGV[2], ARGV[3])
if not cur or #cur < #ARGV[4] or (#cur == #ARGV[4] and cur < ARGV[4]) then
  redis.call('HSET', ARGV[1] .. ARGV[2], ARGV[3], ARGV[4])
end
return 1`)
	// endDue: ARGV max. Returns the ids ended; their key lists are read
	// after (leaseLists), not here: a script blocks Redis while it runs,
	// and the lists of 1,000 leases may be long. A record that cannot be
	// read ends too, rather than stopping every end.
	endDueLeasesScript = redis.NewScript(leaseScriptHead + `
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))) do
  local v = redis.call('HGET', KEYS[1], id)
  if v then
    local ok, r = pcall(cjson.decode, v)
    finish(id, ok and r or {})
    out[#out + 1] = id
  else
    redis.call('ZREM', KEYS[2], id)
  end
end
return out`)
	// forget: ARGV id.
	forgetLeaseScript = redis.NewScript(leaseScriptHead + `
redis.call('DEL', ARGV[1] .. ARGV[2])
return redis.call('SREM', KEYS[4], ARGV[2])`)
)

func (s *Store) leaseKeys() ([]string, string) {
	p := s.cfg.Prefix + ":{leases}:"
	return []string{p + "rec", p + "due", p + "held", p + "ended"}, p + "k:"
}

// runLease runs a lease script with the lease keys and the key-list
// prefix, on c: the write client (never retried) for scripts that change
// anything.
func (s *Store) runLease(ctx context.Context, c redis.Scripter, sc *redis.Script, args ...any) (any, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	keys, list := s.leaseKeys()
	if c == redis.Scripter(s.wc) {
		return s.runWrite(ctx, sc, keys, append([]any{list}, args...)...).Result()
	}
	return sc.Run(ctx, c, keys, append([]any{list}, args...)...).Result()
}

func (s *Store) GrantLease(ctx context.Context, id, holder string, ttl time.Duration, max int) (bool, error) {
	v, err := s.runLease(ctx, s.wc, grantLeaseScript, id, holder, ttl.Milliseconds(), max)
	n, _ := v.(int64)
	return n == 1, err
}

func (s *Store) KeepAliveLease(ctx context.Context, id, holder string) (store.LeaseState, error) {
	v, err := s.runLease(ctx, s.wc, keepAliveLeaseScript, id, holder)
	st, _, err := decodeLeaseState(v, err)
	return st, err
}

func (s *Store) Lease(ctx context.Context, id string) (store.LeaseState, error) {
	v, err := s.runLease(ctx, s.rc, leaseScript, id)
	st, _, err := decodeLeaseState(v, err)
	return st, err
}

func (s *Store) RevokeLease(ctx context.Context, id, holder string) (store.LeaseState, []store.LeaseKey, error) {
	v, err := s.runLease(ctx, s.wc, revokeLeaseScript, id, holder)
	st, rest, err := decodeLeaseState(v, err)
	if err != nil || len(rest) == 0 {
		return st, nil, err
	}
	keys, err := decodeLeaseKeys(rest[0])
	return st, keys, err
}

// decodeLeaseState reads {0} or {1, holder, ttl ms, rest...}.
func decodeLeaseState(v any, err error) (store.LeaseState, []any, error) {
	if err != nil {
		return store.LeaseState{}, nil, err
	}
	out, _ := v.([]any)
	if len(out) == 1 && out[0] == int64(0) {
		return store.LeaseState{}, nil, nil
	}
	if len(out) < 3 || out[0] != int64(1) {
		return store.LeaseState{}, nil, fmt.Errorf("%w: lease script reply %v", store.ErrCorrupt, v)
	}
	h, _ := out[1].(string)
	ms, _ := out[2].(int64)
	return store.LeaseState{Alive: true, Holder: h, TTL: time.Duration(ms) * time.Millisecond}, out[3:], nil
}

func (s *Store) AttachLease(ctx context.Context, id string, k store.LeaseKey) (bool, error) {
	v, err := s.runLease(ctx, s.wc, attachLeaseScript, id, k.Room+"\x00"+k.Key, k.ModRev)
	n, _ := v.(int64)
	return n == 1, err
}

func (s *Store) EndDueLeases(ctx context.Context, max int) (map[string][]store.LeaseKey, error) {
	v, err := s.runLease(ctx, s.wc, endDueLeasesScript, max)
	if err != nil {
		return nil, err
	}
	out, _ := v.([]any)
	ids := make([]string, len(out))
	for i, id := range out {
		ids[i], _ = id.(string)
	}
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	return s.leaseLists(ctx, ids)
}

func (s *Store) ForgetLeaseKeys(ctx context.Context, id string) error {
	_, err := s.runLease(ctx, s.wc, forgetLeaseScript, id)
	return err
}

// EndedLeaseKeys picks up to max ended leases, then reads their lists.
func (s *Store) EndedLeaseKeys(ctx context.Context, max int) (map[string][]store.LeaseKey, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	keys, _ := s.leaseKeys()
	ids, err := s.rc.SRandMemberN(ctx, keys[3], int64(max)).Result()
	if err != nil {
		return nil, err
	}
	return s.leaseLists(ctx, ids)
}

// leaseLists reads the key lists of the leases ids, one HGETALL each in
// a pipeline: Redis serves other clients between them,
// where one script reading them all would hold it for as long as they
// are long. An ended lease's list no longer changes (its record is gone,
// so no key is attached to it).
func (s *Store) leaseLists(ctx context.Context, ids []string) (map[string][]store.LeaseKey, error) {
	_, list := s.leaseKeys()
	cmds := make([]*redis.MapStringStringCmd, len(ids))
	if len(ids) > 0 {
		_, err := s.rc.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.HGetAll(ctx, list+id)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("store: redis: reading ended leases' keys: %w", err)
		}
	}
	m := make(map[string][]store.LeaseKey, len(ids))
	for i, id := range ids {
		keys := make([]store.LeaseKey, 0, len(cmds[i].Val()))
		for f, rv := range cmds[i].Val() {
			k, err := decodeLeaseKey(f, rv)
			if err != nil {
				return m, err
			}
			keys = append(keys, k)
		}
		m[id] = keys
	}
	return m, nil
}

// LeaseIDs reads the records in HSCAN pages, like ListSessions.
func (s *Store) LeaseIDs(ctx context.Context) ([]string, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	keys, _ := s.leaseKeys()
	var ids []string
	for cursor := uint64(0); ; {
		page, next, err := s.rc.HScan(ctx, keys[0], cursor, "", pageSize).Result()
		if err != nil {
			return nil, fmt.Errorf("store: redis: listing leases: %w", err)
		}
		for i := 0; i+1 < len(page); i += 2 {
			ids = append(ids, page[i])
		}
		if cursor = next; cursor == 0 {
			return ids, nil
		}
	}
}

// decodeLeaseKeys reads an HGETALL of a key list: room NUL key -> mod_rev.
func decodeLeaseKeys(v any) ([]store.LeaseKey, error) {
	flat, _ := v.([]any)
	keys := make([]store.LeaseKey, 0, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		f, _ := flat[i].(string)
		rv, _ := flat[i+1].(string)
		k, err := decodeLeaseKey(f, rv)
		if err != nil {
			return keys, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// decodeLeaseKey reads one entry of a key list.
func decodeLeaseKey(f, rv string) (store.LeaseKey, error) {
	room, key, ok := strings.Cut(f, "\x00")
	rev, err := strconv.ParseUint(rv, 10, 64)
	if !ok || err != nil {
		return store.LeaseKey{}, fmt.Errorf("%w: lease key list entry %q", store.ErrCorrupt, f)
	}
	return store.LeaseKey{Room: room, Key: key, ModRev: rev}, nil
}
