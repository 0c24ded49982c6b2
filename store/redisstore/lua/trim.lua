#!lua
-- trim.lua: apply age (and count) retention to a room's log on read, as
-- apply.lua does on write, when a reader found its oldest entry expired.
-- KEYS[1] meta, KEYS[2] log, KEYS[3] wids (the write ids of log's
-- entries, which go with them); ARGV[1] age cutoff (unix ms), ARGV[2] events
-- retained at most. Returns the oldest replayable revision, or false when
-- the room has no meta.
local function fmt(n) return string.format('%d', n) end
local m = redis.call('HMGET', KEYS[1], 'rev', 'epoch', 'events', 'floor')
if not m[2] then return false end
local rev = tonumber(m[1]) or 0
local total = tonumber(m[3]) or 0
local floor = tonumber(m[4]) or 1
local maxev = tonumber(ARGV[2])
local cutoff = tonumber(ARGV[1])
local log = KEYS[2]
local oldest = rev + 1
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
  if not (r < floor or total > maxev or et < cutoff) then
    oldest = r
    break
  end
  if r >= floor then total = total - en end
  if r >= rev then
    floor = rev + 1
    total = 0
    break
  end
  redis.call('XTRIM', log, 'MINID', fmt(r + 1))
  if ew then redis.call('ZREM', KEYS[3], ew) end
end
redis.call('HSET', KEYS[1], 'events', fmt(total), 'floor', fmt(floor))
return fmt(oldest)
