-- restart.lua: a read found a room last checked by another Redis process
-- (run.lua): start its new epoch, or adopt the process when lossless.
-- KEYS[1] meta, KEYS[2] log, KEYS[3] wids; ARGV[1] new epoch, ARGV[2]
-- '1' when a new process loses nothing, ARGV[3] the process's run_id.
-- Returns {epoch, rev, tag} as they are afterwards ('' epoch: no meta,
-- nothing done).
local m = redis.call('HMGET', KEYS[1], 'rev', 'epoch', 'tag', 'run')
if not m[2] then return {'', '0', ''} end
local epoch = checkRun(KEYS[1], KEYS[2], KEYS[3], tonumber(m[1]) or 0, m[2], m[4], ARGV[3], ARGV[1], ARGV[2] == '1')
return {epoch, m[1] or '0', m[3] or ''}
