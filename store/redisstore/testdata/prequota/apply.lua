-- apply.lua: the writes of one group commit to one room (see
-- store/redisstore/commit.go), in order, each as if it ran alone: its own
-- revision, its own conditions checked against the writes before it.
--
-- KEYS[1] meta  HASH  rev, epoch, events (retained), floor, tag, cum (the
--                bytes log ever took in this epoch), base (cum before its oldest
--                entry: it retains cum - base)
-- KEYS[2] kv    HASH  key -> record "mod,create,version,<n>:lease<n>:value"
-- KEYS[3] log   STREAM  ID "<rev>-0"; fields d (batch), n (events), t (unix ms),
--                c (cum before the entry), w (the write id, only when the
--                write has one)
-- KEYS[4] wids  ZSET    write id -> revision, for every entry of log that has one
-- ARGV[1] epoch to create when meta is missing
-- ARGV[2] events retained at most
-- ARGV[3] age cutoff, unix ms: entries committed before it are dropped ('' = none)
-- ARGV[4] channel to SPUBLISH each batch on ('' = none)
-- ARGV[5] TTL in ms of a meta created without a write
-- ARGV[6] bytes retained at most (an entry counts its batch, its write id
--   and entryBytes)
-- ARGV[7] number of writes, then for each: its commit time (unix ms,
--   decimal), its tag (unique per write), its id ('' = none), with an id a
--   revision seen before it was first sent ('' = none), the number of
--   conditions and that many (key, mod_rev), the number of ops and that
--   many (type 'P'|'D', key, value, lease)
--
-- A write's reads and checks run before its first write; its first write
-- is DEL (only for a room whose meta is missing) or XADD, the one that can
-- fail (on a stream ahead of meta): a write whose XADD fails leaves nothing
-- and the next write goes on. Meta and retention are written once, after
-- the last write. Returns one reply per write: {'OK', epoch, rev, batch}
-- | {'NOOP', epoch, rev} | {'CONFLICT', epoch, rev, key, mod_rev}
-- | {'DUP', epoch, rev, the id's revision}
-- | {'UNKNOWN', epoch, rev, oldest logged revision} | {'ERR', message}.
local meta, kv, log, wids = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local function fmt(n) return string.format('%d', n) end

local m = redis.call('HMGET', meta, 'rev', 'epoch', 'events', 'floor', 'tag', 'cum', 'base')
local epoch = m[2]
local fresh = not epoch
local rev, total, floor, prevtag, cum, base = 0, 0, 1, '', 0, 0
if fresh then
  epoch = ARGV[1]
else
  rev = tonumber(m[1]) or 0
  total = tonumber(m[3]) or 0
  floor = tonumber(m[4]) or 1
  prevtag = m[5] or ''
  cum = tonumber(m[6]) or 0 -- a room logged before byte retention: from 0
  base = tonumber(m[7]) or 0
end
local rev0, floor0, wrote, ch = rev, floor, 0, ARGV[4]

local function cur(key)
  if fresh then return nil end
  return redis.call('HGET', kv, key)
end

-- One write; a is the index of its first argument.
local function one(a)
  local now, tag, wid, since = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  a = a + 4
  -- A write id already in wids committed at that revision: nothing more
  -- to do. An unknown one with since: its first attempt may have committed
  -- at a revision trimmed from log (and from wids with it) after since.
  if wid ~= '' and not fresh then
    local at = redis.call('ZSCORE', wids, wid)
    if at then return {'DUP', epoch, fmt(rev), fmt(tonumber(at))} end
    if since ~= '' then
      local first = redis.call('XRANGE', log, '-', '+', 'COUNT', 1)[1]
      local oldest = rev + 1
      if first then oldest = tonumber(string.match(first[1], '^(%d+)')) end
      if oldest > tonumber(since) + 1 then return {'UNKNOWN', epoch, fmt(rev), fmt(oldest)} end
    end
  end

  local ncond = tonumber(ARGV[a]); a = a + 1
  for _ = 1, ncond do
    local key, want = ARGV[a], ARGV[a + 1]; a = a + 2
    local rec = cur(key)
    local mr = '0'
    if rec then mr = string.match(rec, '^(%d+),') end
    if mr ~= want then
      return {'CONFLICT', epoch, fmt(rev), key, mr}
    end
  end

  local newrev = rev + 1
  local nr = fmt(newrev)
  local nops = tonumber(ARGV[a]); a = a + 1
  local body, puts, dels, n = {}, {}, {}, 0
  for _ = 1, nops do
    local op, key, val, lease = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]; a = a + 4
    local prev = cur(key)
    if op == 'P' then
      local create, ver = newrev, 1
      if prev then
        local c, v = string.match(prev, '^%d+,(%d+),(%d+),')
        create, ver = tonumber(c), tonumber(v) + 1
      end
      local rec = nr .. ',' .. fmt(create) .. ',' .. fmt(ver) .. ',' ..
        fmt(#lease) .. ':' .. lease .. fmt(#val) .. ':' .. val
      puts[#puts + 1] = key
      puts[#puts + 1] = rec
      body[#body + 1] = 'P' .. fmt(#key) .. ':' .. key .. rec
    elseif prev then
      dels[#dels + 1] = key
      body[#body + 1] = 'D' .. fmt(#key) .. ':' .. key .. nr .. ';'
    end
    if op == 'P' or prev then
      n = n + 1
      if prev then body[#body + 1] = 'p' .. prev else body[#body + 1] = 'x' end
    end
  end

  if n == 0 then
    if fresh then
      redis.call('DEL', kv, log, wids)
      redis.call('HSET', meta, 'epoch', epoch, 'rev', '0', 'events', '0', 'floor', '1')
      redis.call('PEXPIRE', meta, ARGV[5])
      fresh = false
    end
    return {'NOOP', epoch, fmt(rev)}
  end

  local head = 'B1' .. fmt(#epoch) .. ':' .. epoch .. nr .. ';' .. now .. ';' ..
    fmt(#tag) .. ':' .. tag .. fmt(#prevtag) .. ':' .. prevtag
  if wid ~= '' then
    head = 'B2' .. string.sub(head, 3) .. fmt(#wid) .. ':' .. wid
  end
  local batch = head .. fmt(n) .. ';' .. table.concat(body)

  if fresh then redis.call('DEL', kv, log, wids) end
  local added
  if wid ~= '' then
    added = redis.pcall('XADD', log, nr .. '-0', 'd', batch, 'n', fmt(n), 't', now, 'c', fmt(cum), 'w', wid)
  else
    added = redis.pcall('XADD', log, nr .. '-0', 'd', batch, 'n', fmt(n), 't', now, 'c', fmt(cum))
  end
  if type(added) == 'table' and added.err then return {'ERR', added.err} end
  cum = cum + #batch + #wid + entryBytes
  if wid ~= '' then redis.call('ZADD', wids, newrev, wid) end
  if #puts > 0 then redis.call('HSET', kv, unpack(puts)) end
  if #dels > 0 then redis.call('HDEL', kv, unpack(dels)) end
  rev, prevtag, total, fresh, wrote = newrev, tag, total + n, false, wrote + 1
  if ch ~= '' then redis.call('SPUBLISH', ch, batch) end
  return {'OK', epoch, nr, batch}
end

local out, a = {}, 8
for w = 1, tonumber(ARGV[7]) do
  out[w] = one(a)
  -- Past this write's arguments.
  local ncond = tonumber(ARGV[a + 4])
  local nops = tonumber(ARGV[a + 5 + 2 * ncond])
  a = a + 6 + 2 * ncond + 4 * nops
end
if wrote == 0 then return out end

-- Retention, once for the writes of this call: the same end state as after
-- each write. Only the head can be below floor (retention dropped it): a
-- room within its bounds, without an age limit, is not read. The log holds
-- consecutive revisions up to rev, each of at least one event: when it
-- holds as many entries as events, each is of one event, and a room over
-- its events drops its oldest without reading them (but the new oldest,
-- for its c). Else, or still over its bytes, retain.lua reads them.
local maxev, maxbytes = tonumber(ARGV[2]), tonumber(ARGV[6])
local cutoff = nil
if ARGV[3] ~= '' then cutoff = tonumber(ARGV[3]) end
local read = total > maxev or cutoff or floor0 > rev0 or cum - base > maxbytes
if total > maxev and not cutoff and floor0 <= rev0 then
  local len, drop = redis.call('XLEN', log), total - maxev
  if len == total and drop < len then
    local keep = fmt(rev - len + 1 + drop)
    redis.call('XTRIM', log, 'MINID', keep)
    redis.call('ZREMRANGEBYSCORE', wids, '-inf', '(' .. keep)
    total = maxev
    base = entryCum(redis.call('XRANGE', log, keep, '+', 'COUNT', 1)[1][2]) or 0
    read = cum - base > maxbytes
  end
end
if read then
  local page = 1
  if total > maxev then page = wrote + 1 end -- a full room drops about as many as were added
  local oldest -- (unused: globals are read-only in Redis)
  total, floor, oldest, base = retain(log, wids, rev, total, floor, maxev, cutoff, page, cum, maxbytes)
end

redis.call('HSET', meta, 'rev', fmt(rev), 'epoch', epoch, 'events', fmt(total), 'floor', fmt(floor), 'tag', prevtag,
  'cum', fmt(cum), 'base', fmt(base))
if rev0 == 0 then redis.call('PERSIST', meta) end
return out
