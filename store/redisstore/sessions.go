package redisstore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
)

// Session records on Redis. Three keys under one hash tag, {sessions},
// so that every script stays in one slot of a Redis Cluster:
//
//	<prefix>:{sessions}:rec    HASH  id -> record (JSON, SessionRecord)
//	<prefix>:{sessions}:due    ZSET  id -> deadline (detached sessions)
//	<prefix>:{sessions}:owned  HASH  id -> owner node (attached sessions)
//	<prefix>:{sessions}:on:<node> SET id: the sessions attached to node
//	<prefix>:{sessions}:k:<id> SET   room NUL key: the keys written under the session
//
// The on:<node> sets let the claim of a dead node release its sessions
// without a scan of every session of the cluster: at 100,000 sessions
// that scan ran past the store timeout in every reconnect storm. A set
// may hold an id the owned hash no longer gives that node (a build
// before the sets changed it): the owned hash decides, the set only
// lists. Sessions an older build attached are in no set; the orphan
// sweep's scan (ReleaseSessions) releases those.
//
// Room keys are <prefix>:{room}:meta|kv|log|ch: no suffix is shared, so a
// room named "sessions" does not collide. Times are the Redis server's
// (TIME), as in the node registry. Scripts that change a record run on
// the write client, which never retries: a retry after a lost reply
// would find the record already changed. Every change goes through
// runWrite, or runRecord (those a connect or a write waits for: in the
// group commit's round trips, so a burst of connects does not take a
// pooled connection each), so with MinReplicas it is acknowledged only
// once the replicas hold it: a session's secret is handed out only once
// its record would survive a failover.

var _ store.SharedSessions = (*Store)(nil)

const sessionScriptHead = redisNow + `
local function attached(r) return not r.deadline or tonumber(r.deadline) == 0 end
-- decode reads a record; nil when there is none or it is not one (a
-- corrupt record is as good as gone: no script may fail on it, or one
-- record would stop every take, detach or end that reads it).
local function decode(v)
  if not v then return nil end
  local ok, r = pcall(cjson.decode, v)
  if ok and type(r) == 'table' then return r end
  return nil
end
-- own moves session id to node's set (none: '') from the one the owned
-- hash (KEYS[3]) names, and records node there; on is the sets' prefix.
local function own(id, node, on)
  local was = redis.call('HGET', KEYS[3], id)
  if was and was ~= node then redis.call('SREM', on .. was, id) end
  if node == '' then
    redis.call('HDEL', KEYS[3], id)
  else
    redis.call('HSET', KEYS[3], id, node)
    redis.call('SADD', on .. node, id)
  end
end
-- release starts the grace of session id if the owned hash and its
-- record still give it to node; true if it did.
local function release(id, node, grace)
  if redis.call('HGET', KEYS[3], id) ~= node then return false end
  redis.call('HDEL', KEYS[3], id)
  local r = decode(redis.call('HGET', KEYS[1], id))
  if not r or r.owner ~= node or not attached(r) then return false end
  r.deadline = now + grace
  redis.call('HSET', KEYS[1], id, cjson.encode(r))
  redis.call('ZADD', KEYS[2], r.deadline, id)
  return true
end
`

var (
	// save: KEYS rec, due, owned; ARGV id, record, deadline (0: attached),
	// owner ('' for none), the on-sets' prefix.
	saveSessionScript = redis.NewScript(sessionScriptHead + `
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1]) else redis.call('ZREM', KEYS[2], ARGV[1]) end
own(ARGV[1], ARGV[4], ARGV[5])
return 1`)
	// delete: KEYS rec, due, owned, the session's key list; ARGV id, the
	// on-sets' prefix.
	deleteSessionScript = redis.NewScript(sessionScriptHead + `
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
own(ARGV[1], '', ARGV[2])
return redis.call('DEL', KEYS[4])`)
	// del: KEYS the key to delete.
	delScript = redis.NewScript(`return redis.call('DEL', KEYS[1])`)
	// take: KEYS rec, due, owned; ARGV id, subject, old hash, new hash
	// (base64), node, when the node read the connect (Redis ms; 0: not
	// known), the on-sets' prefix, the Redis clock the read is on. Returns {1, prev owner, record}, {0} (refused) or {2} (a
	// stale take). The hash presented is accepted when it is the current
	// one or the one presented at the last take: that take's reply may
	// have been lost (its node then closed the socket, 1011), so the
	// client never got the new secret and presents the old one again; but
	// not when this connect was read before the last take's, which the
	// client then made after giving this one up (store.ErrStaleTake).
	takeScript = redis.NewScript(sessionScriptHead + `
local r = decode(redis.call('HGET', KEYS[1], ARGV[1]))
if not r then
  if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then -- corrupt: nobody resumes it
    redis.call('ZREM', KEYS[2], ARGV[1])
    own(ARGV[1], '', ARGV[7])
  end
  return {0}
end
local retry = r.resume_hash ~= ARGV[3]
if r.subject ~= ARGV[2] or (retry and r.prev_hash ~= ARGV[3]) then return {0} end
if not attached(r) and tonumber(r.deadline) <= now then return {0} end
local read, took, clock = tonumber(ARGV[6]), tonumber(r.took) or 0, ARGV[8]
-- took is compared only with a read on the clock it was read on: a
-- failover changes the Redis process the nodes map onto, and the new
-- one's clock may be behind. Unnamed clocks (INFO refused, or a record
-- from before they were named): only when not more than 5 s ahead.
if (r.took_clock or '') ~= clock or (clock == '' and took > now + 5000) then took = 0 end
if retry and read > 0 and read < took then return {2} end
local prev = r.owner or ''
r.prev_hash = ARGV[3]
r.resume_hash = ARGV[4]
r.owner = ARGV[5]
r.gen = (tonumber(r.gen) or 0) + 1
r.deadline = nil
if read > took then r.took, r.took_clock = read, clock end
local v = cjson.encode(r)
redis.call('HSET', KEYS[1], ARGV[1], v)
redis.call('ZREM', KEYS[2], ARGV[1])
own(ARGV[1], ARGV[5], ARGV[7])
return {1, prev, v}`)
	// detach: KEYS rec, due, owned; ARGV id, gen, grace ms, the on-sets'
	// prefix.
	detachScript = redis.NewScript(sessionScriptHead + `
local r = decode(redis.call('HGET', KEYS[1], ARGV[1]))
if not r or (tonumber(r.gen) or 0) ~= tonumber(ARGV[2]) or not attached(r) then return 0 end
r.deadline = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(r))
redis.call('ZADD', KEYS[2], r.deadline, ARGV[1])
own(ARGV[1], '', ARGV[4])
return 1`)
	// release: KEYS rec, due, owned; ARGV grace ms, k, k dead nodes, the
	// on-sets' prefix, then session ids. Each id is checked again (still
	// owned by a dead node, its record attached to it): one HSCAN returned
	// twice, or taken by a live node since it was read, is left alone.
	releaseScript = redis.NewScript(sessionScriptHead + `
local dead = {}
local k = tonumber(ARGV[2])
for i = 3, 2 + k do dead[ARGV[i]] = true end
local on = ARGV[3 + k]
local n = 0
for i = 4 + k, #ARGV do
  local id = ARGV[i]
  local node = redis.call('HGET', KEYS[3], id)
  if node and dead[node] then
    redis.call('SREM', on .. node, id)
    if release(id, node, tonumber(ARGV[1])) then n = n + 1 end
  end
end
return n`)
	// releaseNode: KEYS rec, due, owned, node's on-set; ARGV grace ms,
	// node, how many. Takes that many ids out of the set and starts the
	// grace of those still node's; returns {released, left in the set}.
	releaseNodeScript = redis.NewScript(sessionScriptHead + `
local n = 0
for _, id in ipairs(redis.call('SPOP', KEYS[4], tonumber(ARGV[3]))) do
  if release(id, ARGV[2], tonumber(ARGV[1])) then n = n + 1 end
end
return {n, redis.call('SCARD', KEYS[4])}`)
	// endDue: KEYS rec, due, owned; ARGV max, key-list prefix, its TTL
	// ms. Returns the records removed; each list expires unless its ender
	// forgets it first. The lists are read after (SMEMBERS, pipelined),
	// not here: a script blocks Redis, and 1,000 lists may be long.
	endDueScript = redis.NewScript(sessionScriptHead + `
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[2], id)
  local v = redis.call('HGET', KEYS[1], id)
  local r = decode(v)
  if v and not r then -- corrupt: it ends; the orphan sweep deletes its keys
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('PEXPIRE', ARGV[2] .. id, ARGV[3])
  elseif r then
    if not attached(r) and tonumber(r.deadline) <= now then
      redis.call('HDEL', KEYS[1], id)
      redis.call('HDEL', KEYS[3], id)
      out[#out + 1] = v
      redis.call('PEXPIRE', ARGV[2] .. id, ARGV[3])
    end
  end
end
return out`)
	// listKey: KEYS rec; ARGV key-list prefix, id, room NUL key, max
	// keys, TTL ms. 0: no record; 2: the record does not say listed (an
	// older build's, or its list filled up: its end scans); 1: listed.
	// Each listing renews the list's TTL, so a list no ender forgets (one
	// of an older build) goes.
	listSessionKeyScript = redis.NewScript(`
local v = redis.call('HGET', KEYS[1], ARGV[2])
if not v then return 0 end
local ok, r = pcall(cjson.decode, v)
if not ok or type(r) ~= 'table' then return 0 end -- corrupt: as good as gone
if not r.listed then return 2 end
local list = ARGV[1] .. ARGV[2]
if redis.call('SISMEMBER', list, ARGV[3]) == 0 and redis.call('SCARD', list) >= tonumber(ARGV[4]) then
  r.listed = nil
  redis.call('HSET', KEYS[1], ARGV[2], cjson.encode(r))
  redis.call('DEL', list)
  return 2
end
redis.call('SADD', list, ARGV[3])
redis.call('PEXPIRE', list, ARGV[5])
return 1`)
)

const (
	// endedListTTL bounds how long the key list of an ended session stays
	// when its ender dies before forgetting it (an orphan sweep deletes
	// such keys anyway).
	endedListTTL = time.Hour
	// listTTL: a list not added to for this long goes, and its session
	// with it, after its grace, leaves its keys to the orphan sweep.
	listTTL = 24 * time.Hour
	// maxListedKeys a session: past them it is ended by a scan.
	maxListedKeys = 10_000
	// releaseBatch bounds the sessions one release script rewrites: a
	// script blocks Redis while it runs, and one over the 16,700 sessions
	// of a dead node (of 100,000) ran past the 5 s busy threshold.
	releaseBatch = 250
)

// decodeSession reads a record as SaveSession and the scripts write it:
// JSON, by SessionRecord's tags (the scripts read and change the fields
// subject, resume_hash, owner, gen and deadline by those names).
func decodeSession(v string) (store.SessionRecord, error) {
	var rec store.SessionRecord
	if err := json.Unmarshal([]byte(v), &rec); err != nil {
		return rec, fmt.Errorf("%w: session record: %v", store.ErrCorrupt, err)
	}
	return rec, nil
}

func (s *Store) sessionKeys() []string {
	p := s.cfg.Prefix + ":{sessions}:"
	return []string{p + "rec", p + "due", p + "owned"}
}

// sessionKeyList is the prefix of the sessions' key lists.
func (s *Store) sessionKeyList() string { return s.cfg.Prefix + ":{sessions}:k:" }

// sessionsOn is the prefix of the sets of the sessions attached to each
// node.
func (s *Store) sessionsOn() string { return s.cfg.Prefix + ":{sessions}:on:" }

// SaveSession writes rec (a new session, or a single-node rewrite) with
// its index entries.
func (s *Store) SaveSession(ctx context.Context, rec store.SessionRecord) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	owner := rec.Owner
	if rec.Deadline > 0 { // detached: owned by no node
		owner = ""
	}
	return s.runRecord(ctx, saveSessionScript, s.sessionKeys(), rec.ID, v, rec.Deadline, owner, s.sessionsOn()).Err()
}

func (s *Store) Session(ctx context.Context, id string) (store.SessionRecord, bool, error) {
	if err := s.begin(); err != nil {
		return store.SessionRecord{}, false, err
	}
	defer s.mu.RUnlock()
	v, err := s.rc.HGet(ctx, s.sessionKeys()[0], id).Result()
	if err == redis.Nil {
		return store.SessionRecord{}, false, nil
	}
	if err != nil {
		return store.SessionRecord{}, false, err
	}
	rec, err := decodeSession(v)
	return rec, err == nil, err
}

func (s *Store) DeleteSession(ctx context.Context, id string) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return s.runWrite(ctx, deleteSessionScript, append(s.sessionKeys(), s.sessionKeyList()+id), id, s.sessionsOn()).Err()
}

// ListSessions reads the records in HSCAN pages (one HGETALL of many
// sessions would stall Redis for everyone).
func (s *Store) ListSessions(ctx context.Context) ([]store.SessionRecord, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	all := make(map[string]string)
	for cursor := uint64(0); ; {
		page, next, err := s.rc.HScan(ctx, s.sessionKeys()[0], cursor, "", pageSize).Result()
		if err != nil {
			return nil, fmt.Errorf("store: redis: listing sessions: %w", err)
		}
		for i := 0; i+1 < len(page); i += 2 {
			all[page[i]] = page[i+1]
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	out := make([]store.SessionRecord, 0, len(all))
	for _, v := range all {
		rec, err := decodeSession(v)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

func (s *Store) TakeSession(ctx context.Context, id, subject string, old, new []byte, node string, read time.Time) (store.SessionRecord, string, bool, error) {
	if err := s.begin(); err != nil {
		return store.SessionRecord{}, "", false, err
	}
	defer s.mu.RUnlock()
	b64 := base64.StdEncoding.EncodeToString
	var readMS int64 // 0: not known
	var clock string
	if ms, id, ok := s.clock.mapped(read); ok && !read.IsZero() {
		readMS, clock = ms, id
	}
	v, err := s.runRecord(ctx, takeScript, s.sessionKeys(), id, subject, b64(old), b64(new), node, readMS, s.sessionsOn(), clock).Slice()
	if err == nil && len(v) == 1 && v[0] == int64(2) {
		return store.SessionRecord{}, "", false, store.ErrStaleTake
	}
	if err != nil || len(v) < 3 {
		return store.SessionRecord{}, "", false, err
	}
	prev, _ := v[1].(string)
	enc, _ := v[2].(string)
	rec, err := decodeSession(enc)
	return rec, prev, err == nil, err
}

func (s *Store) DetachSession(ctx context.Context, id string, gen int64, grace time.Duration) (bool, error) {
	if err := s.begin(); err != nil {
		return false, err
	}
	defer s.mu.RUnlock()
	n, err := s.runRecord(ctx, detachScript, s.sessionKeys(), id, gen, grace.Milliseconds(), s.sessionsOn()).Int()
	return n == 1, err
}

// SessionOwners reads the owners in HSCAN pages (one HVALS of every
// session of the cluster would stall Redis for everyone).
func (s *Store) SessionOwners(ctx context.Context) ([]string, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	seen := make(map[string]bool)
	var out []string
	err := s.scanOwned(ctx, func(_, node string) error {
		if !seen[node] {
			seen[node] = true
			out = append(out, node)
		}
		return nil
	})
	return out, err
}

// ReleaseSessions reads the owners in HSCAN pages and releases those of
// the dead nodes releaseBatch at a time: each script is short, however
// many sessions the cluster holds.
func (s *Store) ReleaseSessions(ctx context.Context, dead []string, grace time.Duration) (int, error) {
	if len(dead) == 0 {
		return 0, nil
	}
	if err := s.begin(); err != nil {
		return 0, err
	}
	defer s.mu.RUnlock()
	isDead := make(map[string]bool, len(dead))
	head := []any{grace.Milliseconds(), len(dead)}
	for _, n := range dead {
		isDead[n] = true
		head = append(head, n)
	}
	head = append(head, s.sessionsOn())
	var ids []any
	n := 0
	release := func() error {
		if h := s.hookRelease.Load(); h != nil {
			(*h)(len(ids))
		}
		got, err := s.runWrite(ctx, releaseScript, s.sessionKeys(), slices.Concat(head, ids)...).Int()
		n += got
		ids = ids[:0]
		return err
	}
	err := s.scanOwned(ctx, func(id, node string) error {
		if !isDead[node] {
			return nil
		}
		if ids = append(ids, id); len(ids) < releaseBatch {
			return nil
		}
		return release()
	})
	if err == nil && len(ids) > 0 {
		err = release()
	}
	// Their sets may still list sessions an older build moved elsewhere.
	for _, node := range dead {
		if err != nil {
			break
		}
		var m int
		m, err = s.releaseNode(ctx, node, grace)
		n += m
	}
	return n, err
}

// ReleaseNodeSessions takes node's set releaseBatch ids at a time and
// releases those still attached to it: no scan, however many sessions
// the cluster holds.
func (s *Store) ReleaseNodeSessions(ctx context.Context, node string, grace time.Duration) (int, error) {
	if err := s.begin(); err != nil {
		return 0, err
	}
	defer s.mu.RUnlock()
	return s.releaseNode(ctx, node, grace)
}

func (s *Store) releaseNode(ctx context.Context, node string, grace time.Duration) (int, error) {
	keys := append(s.sessionKeys(), s.sessionsOn()+node)
	n := 0
	for {
		v, err := s.runWrite(ctx, releaseNodeScript, keys, grace.Milliseconds(), node, releaseBatch).Int64Slice()
		if err != nil || len(v) != 2 {
			return n, err
		}
		if n += int(v[0]); v[1] == 0 {
			return n, nil
		}
	}
}

// scanOwned calls fn with each attached session and its owner, in HSCAN
// pages of the owned hash.
func (s *Store) scanOwned(ctx context.Context, fn func(id, node string) error) error {
	for cursor := uint64(0); ; {
		page, next, err := s.rc.HScan(ctx, s.sessionKeys()[2], cursor, "", pageSize).Result()
		if err != nil {
			return fmt.Errorf("store: redis: listing session owners: %w", err)
		}
		for i := 0; i+1 < len(page); i += 2 {
			if err := fn(page[i], page[i+1]); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

func (s *Store) EndDueSessions(ctx context.Context, max int) ([]store.SessionRecord, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	v, err := s.runWrite(ctx, endDueScript, s.sessionKeys(), max, s.sessionKeyList(), endedListTTL.Milliseconds()).StringSlice()
	if err != nil {
		return nil, err
	}
	out := make([]store.SessionRecord, 0, len(v))
	var bad error // a record that cannot be read is gone; the others end
	for _, enc := range v {
		rec, err := decodeSession(enc)
		if err != nil {
			bad = err
			continue
		}
		out = append(out, rec)
	}
	// A list no longer changes once its record is gone (ListSessionKey
	// refuses the key).
	lists := make([]*redis.StringSliceCmd, len(out))
	if len(out) > 0 {
		_, err = s.rc.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, rec := range out {
				lists[i] = p.SMembers(ctx, s.sessionKeyList()+rec.ID)
			}
			return nil
		})
		if err != nil {
			for i := range out {
				out[i].Listed = false // its ender scans the rooms for its keys
			}
			return out, fmt.Errorf("store: redis: reading ended sessions' keys: %w", err)
		}
	}
	for i := range out {
		for _, f := range lists[i].Val() {
			room, key, ok := strings.Cut(f, "\x00")
			if !ok {
				return out, fmt.Errorf("%w: session key list entry %q", store.ErrCorrupt, f)
			}
			out[i].Keys = append(out[i].Keys, store.LeaseKey{Room: room, Key: key})
		}
	}
	return out, bad
}

func (s *Store) ListSessionKey(ctx context.Context, id, room, key string) (store.Listing, error) {
	if err := s.begin(); err != nil {
		return store.NotListed, err
	}
	defer s.mu.RUnlock()
	n, err := s.runRecord(ctx, listSessionKeyScript, s.sessionKeys()[:1], s.sessionKeyList(), id, room+"\x00"+key,
		maxListedKeys, listTTL.Milliseconds()).Int()
	return store.Listing(n), err
}

func (s *Store) ForgetSessionKeys(ctx context.Context, id string) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return s.runWrite(ctx, delScript, []string{s.sessionKeyList() + id}).Err()
}

func (s *Store) CurrentKeys(ctx context.Context, room string, keys []string) ([]store.KV, error) {
	if err := store.ValidRoom(room); err != nil {
		return nil, err
	}
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	vals, err := s.rc.HMGet(ctx, s.keys(room).kv, keys...).Result()
	if err != nil {
		return nil, err
	}
	var out []store.KV
	for i, v := range vals {
		if rec, ok := v.(string); ok {
			kv, err := decodeKV(keys[i], rec)
			if err != nil {
				return out, err
			}
			out = append(out, kv)
		}
	}
	return out, nil
}
