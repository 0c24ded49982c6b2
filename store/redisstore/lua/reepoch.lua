#!lua
-- reepoch.lua: start a new epoch for a room whose history diverged from
-- what a node delivered (a failover lost acknowledged writes). Clients and
-- nodes of the old epoch then resync from a snapshot instead of mixing two
-- histories. The state (kv) stays: it is the room's state at rev; the log
-- goes, since its entries belong to the old epoch, and the write ids of its
-- entries with it.
-- KEYS[1] meta, KEYS[2] log, KEYS[3] wids; ARGV[1] expected epoch, ARGV[2] expected rev,
-- ARGV[3] expected tag, ARGV[4] new epoch. Nothing changes unless meta
-- still holds the expected epoch, rev and tag (another node may have acted
-- first). Returns {epoch, rev, tag} as they are afterwards ('' epoch: no meta).
local m = redis.call('HMGET', KEYS[1], 'rev', 'epoch', 'tag')
local rev, epoch, tag = m[1] or '0', m[2] or '', m[3] or ''
if epoch ~= ARGV[1] or rev ~= ARGV[2] or tag ~= ARGV[3] then
  return {epoch, rev, tag}
end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'epoch', ARGV[4], 'events', '0', 'floor', string.format('%d', tonumber(rev) + 1),
  'cum', '0', 'base', '0')
return {ARGV[4], rev, tag}
