#!lua
-- apply.lua: one Write to one room, atomically (see store/redisstore/store.go).
--
-- KEYS[1] meta  HASH  rev, epoch, events (retained), floor, tag
-- KEYS[2] kv    HASH  key -> record "mod,create,version,<n>:lease<n>:value"
-- KEYS[3] log   STREAM  ID "<rev>-0"; fields d (batch), n (events), t (unix ms),
--                w (the write id, only when the write has one)
-- KEYS[4] wids  ZSET    write id -> revision, for every entry of log that has one
-- ARGV[1] epoch to create when meta is missing
-- ARGV[2] commit time, unix ms (decimal)
-- ARGV[3] events retained at most
-- ARGV[4] age cutoff, unix ms: entries committed before it are dropped ('' = none)
-- ARGV[5] channel to SPUBLISH the batch on ('' = none)
-- ARGV[6] this write's tag (unique per write)
-- ARGV[7] TTL in ms of a meta created without a write
-- ARGV[8] the write's id ('' = none)
-- ARGV[9] with an id: a revision seen before the write was first sent ('' = none)
-- ARGV[10] number of conditions, then that many (key, mod_rev)
-- then the number of ops, then that many (type 'P'|'D', key, value, lease)
--
-- Every read and check runs before the first write; the first write is DEL
-- (only for a room whose meta is missing) or XADD, which cannot fail after
-- the checks, so an error leaves nothing half-written. Returns
-- {'OK', epoch, rev, batch} | {'NOOP', epoch, rev} | {'CONFLICT', epoch, rev, key, mod_rev}
-- | {'DUP', epoch, rev, the id's revision} | {'UNKNOWN', epoch, rev, oldest logged revision}.
local meta, kv, log, wids = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local function fmt(n) return string.format('%d', n) end

local m = redis.call('HMGET', meta, 'rev', 'epoch', 'events', 'floor', 'tag')
local epoch = m[2]
local fresh = not epoch
local rev, events, floor, prevtag = 0, 0, 1, ''
if fresh then
  epoch = ARGV[1]
else
  rev = tonumber(m[1]) or 0
  events = tonumber(m[3]) or 0
  floor = tonumber(m[4]) or 1
  prevtag = m[5] or ''
end

local function cur(key)
  if fresh then return nil end
  return redis.call('HGET', kv, key)
end

local function init()
  redis.call('DEL', kv, log, wids)
  redis.call('HSET', meta, 'epoch', epoch, 'rev', '0', 'events', '0', 'floor', '1')
  redis.call('PEXPIRE', meta, ARGV[7])
end

-- A write id already in wids committed at that revision: nothing more to
-- do. An unknown one with since: its first attempt may have committed at
-- a revision trimmed from log (and from wids with it) after since.
local wid, since = ARGV[8], ARGV[9]
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

local a = 10
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
    local rec = fmt(newrev) .. ',' .. fmt(create) .. ',' .. fmt(ver) .. ',' ..
      fmt(#lease) .. ':' .. lease .. fmt(#val) .. ':' .. val
    puts[#puts + 1] = key
    puts[#puts + 1] = rec
    body[#body + 1] = 'P' .. fmt(#key) .. ':' .. key .. rec
  elseif prev then
    dels[#dels + 1] = key
    body[#body + 1] = 'D' .. fmt(#key) .. ':' .. key .. fmt(newrev) .. ';'
  end
  if op == 'P' or prev then
    n = n + 1
    if prev then body[#body + 1] = 'p' .. prev else body[#body + 1] = 'x' end
  end
end

if n == 0 then
  if fresh then init() end
  return {'NOOP', epoch, fmt(rev)}
end

local tag = ARGV[6]
local head = 'B1' .. fmt(#epoch) .. ':' .. epoch .. fmt(newrev) .. ';' .. ARGV[2] .. ';' ..
  fmt(#tag) .. ':' .. tag .. fmt(#prevtag) .. ':' .. prevtag
if wid ~= '' then
  head = 'B2' .. string.sub(head, 3) .. fmt(#wid) .. ':' .. wid
end
local batch = head .. fmt(n) .. ';' .. table.concat(body)

if fresh then redis.call('DEL', kv, log, wids) end
if wid ~= '' then
  redis.call('XADD', log, fmt(newrev) .. '-0', 'd', batch, 'n', fmt(n), 't', ARGV[2], 'w', wid)
  redis.call('ZADD', wids, newrev, wid)
else
  redis.call('XADD', log, fmt(newrev) .. '-0', 'd', batch, 'n', fmt(n), 't', ARGV[2])
end
if #puts > 0 then redis.call('HSET', kv, unpack(puts)) end
if #dels > 0 then redis.call('HDEL', kv, unpack(dels)) end

-- Retention: drop whole revisions from the oldest while too many events
-- are retained or the oldest is too old. The newest entry always stays in
-- the log (a node that missed it can still read it); when it too is
-- dropped, floor moves past it and readers treat it as compacted.
local total = events + n
local maxev = tonumber(ARGV[3])
local cutoff = nil
if ARGV[4] ~= '' then cutoff = tonumber(ARGV[4]) end
while true do
  local e = redis.call('XRANGE', log, '-', '+', 'COUNT', 1)[1]
  if not e then break end
  local r = tonumber(string.match(e[1], '^(%d+)'))
  local en, et, ew = 0, 0, nil
  local f = e[2]
  for j = 1, #f, 2 do
    if f[j] == 'n' then en = tonumber(f[j + 1]) elseif f[j] == 't' then et = tonumber(f[j + 1])
    elseif f[j] == 'w' then ew = f[j + 1] end
  end
  if not (r < floor or total > maxev or (cutoff and et < cutoff)) then break end
  if r >= floor then total = total - en end
  if r >= newrev then
    floor = newrev + 1
    total = 0
    break
  end
  redis.call('XTRIM', log, 'MINID', fmt(r + 1))
  if ew then redis.call('ZREM', wids, ew) end
end

redis.call('HSET', meta, 'rev', fmt(newrev), 'epoch', epoch, 'events', fmt(total), 'floor', fmt(floor), 'tag', tag)
if rev == 0 then redis.call('PERSIST', meta) end
if ARGV[5] ~= '' then redis.call('SPUBLISH', ARGV[5], batch) end
return {'OK', epoch, fmt(newrev), batch}
