-- trim.lua: apply age (and count) retention to a room's log on read, as
-- apply.lua does on write, when a reader found its oldest entry expired.
-- KEYS[1] meta, KEYS[2] log, KEYS[3] wids (the write ids of log's
-- entries, which go with them); ARGV[1] age cutoff (unix ms), ARGV[2] events
-- and ARGV[3] bytes retained at most. Returns the oldest replayable
-- revision, or false when the room has no meta.
local m = redis.call('HMGET', KEYS[1], 'rev', 'epoch', 'events', 'floor', 'cum')
if not m[2] then return false end
local rev = tonumber(m[1]) or 0
local total, floor, oldest, base = retain(KEYS[2], KEYS[3], rev, tonumber(m[3]) or 0, tonumber(m[4]) or 1,
  tonumber(ARGV[2]), tonumber(ARGV[1]), 1, tonumber(m[5]) or 0, tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'events', string.format('%d', total), 'floor', string.format('%d', floor),
  'base', string.format('%d', base))
return string.format('%d', oldest)
