-- apply.lua: the writes of one group commit to one room (see
-- store/redisstore/commit.go), in order, each as if it ran alone: its own
-- revision, its own conditions checked against the writes before it.
--
-- KEYS[1] meta  HASH  rev, epoch, events (retained), floor, tag, cum (the
--                bytes log ever took in this epoch), base (cum before its oldest
--                entry: it retains cum - base), ukeys and ubytes (the room's keys
--                and bytes of keys and values, for its quota) counted at revision urev
-- KEYS[2] kv    HASH  key -> record "mod,create,version,<n>:lease<n>:value"
-- KEYS[3] log   STREAM  ID "<rev>-0"; fields d (batch), n (events), t (unix ms),
--                c (cum before the entry), w (the write id, only when the
--                write has one), f (its fingerprint, with w; none in an entry
--                of an older build)
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
--   revision seen before it was first sent ('' = none), its fingerprint and
--   the id as an older build stored it (looked up, never stored; '' = none),
--   the number of
--   conditions and that many (key, mod_rev), the number of ops and that
--   many (type 'P'|'D', key, value, lease); a put's type may be followed
--   by flags: 'l' keeps the key's lease (none for a new key), 'v' keeps
--   its value, 'e' (and 'v') refuses a key that does not exist
-- ARGV[8], ARGV[9] the room's quota: keys, bytes of keys and values; a
--   write that grows either past it is refused
-- ARGV[10] '1' when a new Redis process loses no acknowledged write
--   (run.lua): a room it has not checked yet keeps its epoch
-- ARGV[11] the run_id of the process the writes were built for, the one
--   running them ('' when the node cannot tell)
--
-- A room last written or checked by another Redis process starts its new
-- epoch (ARGV[1]) first (run.lua); the writes are then its first.
--
-- A write's reads and checks run before its first write; its first write
-- is DEL (only for a room whose meta is missing) or XADD, the one that can
-- fail (on a stream ahead of meta): a write whose XADD fails leaves nothing
-- and the next write goes on. Meta and retention are written once, after
-- the last write. Returns one reply per write: {'OK', epoch, rev, batch}
-- | {'NOOP', epoch, rev} | {'CONFLICT', epoch, rev, key, mod_rev}
-- | {'DUP', epoch, rev, the id's revision}
-- | {'REUSED', epoch, rev, the id's revision} (the id committed another write)
-- | {'UNKNOWN', epoch, rev, oldest logged revision} | {'ERR', message}
-- | {'QUOTA', epoch, rev, keys, bytes the write would have made}
-- | {'MISSING', epoch, rev, key} (a put that must find its key did not).
local meta, kv, log, wids = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local function fmt(n) return string.format('%d', n) end

local m = redis.call('HMGET', meta, 'rev', 'epoch', 'events', 'floor', 'tag', 'cum', 'base', 'ukeys', 'ubytes', 'urev', 'run')
local epoch = m[2]
local fresh = not epoch
local run = ARGV[11]
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
  local restarted
  epoch, restarted = checkRun(meta, log, wids, rev, epoch, m[11], run, ARGV[1], ARGV[10] == '1')
  if restarted then total, floor, cum, base = 0, rev + 1, 0, 0 end
end
local rev0, floor0, wrote, ch = rev, floor, 0, ARGV[4]
local quotakeys, quotabytes = tonumber(ARGV[8]), tonumber(ARGV[9])

-- The length of the value of a kv record.
local function vlen(rec)
  local ll, p = string.match(rec, '^%d+,%d+,%d+,(%d+):()')
  return tonumber(string.match(rec, '^(%d+):', p + tonumber(ll)))
end

-- The lease and the value of a kv record.
local function leaseval(rec)
  local ll, p = string.match(rec, '^%d+,%d+,%d+,(%d+):()')
  local q = p + tonumber(ll)
  local vl, r = string.match(rec, '^(%d+):()', q)
  return string.sub(rec, p, q - 1), string.sub(rec, r, r + tonumber(vl) - 1)
end

-- The room's usage, trusted when counted at its revision; else (a room
-- written by an older build, which keeps no count, or none since) counted
-- here once, keys by HLEN and bytes in HSCAN pages; the call stores it.
local ukeys, ubytes
if fresh then
  ukeys, ubytes = 0, 0
elseif m[10] == m[1] and m[8] and m[9] then
  ukeys, ubytes = tonumber(m[8]), tonumber(m[9])
end
local function usage()
  if ukeys then return end
  ukeys, ubytes = redis.call('HLEN', kv), 0
  local c = '0'
  repeat
    local r = redis.call('HSCAN', kv, c, 'COUNT', 1000)
    c = r[1]
    for i = 1, #r[2], 2 do ubytes = ubytes + #r[2][i] + vlen(r[2][i + 1]) end
  until c == '0'
end

local function cur(key)
  if fresh then return nil end
  return redis.call('HGET', kv, key)
end

-- One write; a is the index of its first argument.
local function one(a)
  local now, tag, wid, since, fp, legacy = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  a = a + 6
  -- A write id already in wids committed at that revision: nothing more
  -- to do, if its entry's fingerprint is this write's (an entry without
  -- one is an older build's). An unknown one with since: its first
  -- attempt may have committed at a revision trimmed from log (and from
  -- wids with it) after since.
  if wid ~= '' and not fresh then
    local at = redis.call('ZSCORE', wids, wid)
    if at then
      local id = fmt(tonumber(at)) .. '-0'
      local e = redis.call('XRANGE', log, id, id)[1]
      if e then
        for j = 1, #e[2], 2 do
          if e[2][j] == 'f' and e[2][j + 1] ~= fp then return {'REUSED', epoch, fmt(rev), fmt(tonumber(at))} end
        end
      end
      return {'DUP', epoch, fmt(rev), fmt(tonumber(at))}
    end
    -- The id as an older build stored it counts only in an entry of
    -- such a build (no fingerprint): a newer build's is another writer's.
    if legacy ~= '' then
      at = redis.call('ZSCORE', wids, legacy)
      if at then
        local id = fmt(tonumber(at)) .. '-0'
        local e = redis.call('XRANGE', log, id, id)[1]
        local stamped = false
        if e then
          for j = 1, #e[2], 2 do
            if e[2][j] == 'f' then stamped = true end
          end
        end
        if not stamped then return {'DUP', epoch, fmt(rev), fmt(tonumber(at))} end
      end
    end
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
  local dk, db = 0, 0 -- what the write adds to the room's usage
  for _ = 1, nops do
    local op, key, val, lease = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]; a = a + 4
    local prev = cur(key)
    local kind, flags = string.sub(op, 1, 1), string.sub(op, 2)
    if kind == 'P' and not prev and string.find(flags, '[ve]') then
      return {'MISSING', epoch, fmt(rev), key}
    end
    if kind == 'P' then
      local create, ver = newrev, 1
      if prev then
        local c, v = string.match(prev, '^%d+,(%d+),(%d+),')
        create, ver = tonumber(c), tonumber(v) + 1
        if flags ~= '' then
          local l, pv = leaseval(prev)
          if string.find(flags, 'l', 1, true) then lease = l end
          if string.find(flags, 'v', 1, true) then val = pv end
        end
      end
      local rec = nr .. ',' .. fmt(create) .. ',' .. fmt(ver) .. ',' ..
        fmt(#lease) .. ':' .. lease .. fmt(#val) .. ':' .. val
      puts[#puts + 1] = key
      puts[#puts + 1] = rec
      if prev then db = db + #val - vlen(prev) else dk, db = dk + 1, db + #key + #val end
      body[#body + 1] = 'P' .. fmt(#key) .. ':' .. key .. rec
    elseif prev then
      dels[#dels + 1] = key
      dk, db = dk - 1, db - #key - vlen(prev)
      body[#body + 1] = 'D' .. fmt(#key) .. ':' .. key .. nr .. ';'
    end
    if kind == 'P' or prev then
      n = n + 1
      if prev then body[#body + 1] = 'p' .. prev else body[#body + 1] = 'x' end
    end
  end

  if n == 0 then
    if fresh then
      redis.call('DEL', kv, log, wids)
      redis.call('HSET', meta, 'epoch', epoch, 'rev', '0', 'events', '0', 'floor', '1')
      if run ~= '' then redis.call('HSET', meta, 'run', run) end
      redis.call('PEXPIRE', meta, ARGV[5])
      fresh = false
    end
    return {'NOOP', epoch, fmt(rev)}
  end

  -- The quota: a write that grows what would be over it is refused.
  usage()
  local nk, nb = ukeys + dk, ubytes + db
  if (dk > 0 and nk > quotakeys) or (db > 0 and nb > quotabytes) then
    return {'QUOTA', epoch, fmt(rev), fmt(nk), fmt(nb)}
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
    added = redis.pcall('XADD', log, nr .. '-0', 'd', batch, 'n', fmt(n), 't', now, 'c', fmt(cum), 'w', wid, 'f', fp)
  else
    added = redis.pcall('XADD', log, nr .. '-0', 'd', batch, 'n', fmt(n), 't', now, 'c', fmt(cum))
  end
  if type(added) == 'table' and added.err then return {'ERR', added.err} end
  cum = cum + #batch + #wid + entryBytes -- (a fingerprint is within entryBytes)
  if wid ~= '' then redis.call('ZADD', wids, newrev, wid) end
  if #puts > 0 then redis.call('HSET', kv, unpack(puts)) end
  if #dels > 0 then redis.call('HDEL', kv, unpack(dels)) end
  rev, prevtag, total, fresh, wrote = newrev, tag, total + n, false, wrote + 1
  ukeys, ubytes = nk, nb
  if ch ~= '' then redis.call('SPUBLISH', ch, batch) end
  return {'OK', epoch, nr, batch}
end

local out, a = {}, 12
for w = 1, tonumber(ARGV[7]) do
  out[w] = one(a)
  -- Past this write's arguments.
  local ncond = tonumber(ARGV[a + 6])
  local nops = tonumber(ARGV[a + 7 + 2 * ncond])
  a = a + 8 + 2 * ncond + 4 * nops
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
  'cum', fmt(cum), 'base', fmt(base), 'ukeys', fmt(ukeys), 'ubytes', fmt(ubytes), 'urev', fmt(rev))
if run ~= '' and rev0 == 0 then redis.call('HSET', meta, 'run', run) end -- (checkRun records it on a room's later writes)
if rev0 == 0 then redis.call('PERSIST', meta) end
return out
