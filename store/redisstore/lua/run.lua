-- run.lua: which Redis process a room was last written or checked by,
-- the head of apply.lua and restart.lua (store.go sends each with it).
--
-- meta's 'run' is the run_id of that process. A process of another run_id
-- (Redis restarted, or a replica promoted) may have come back without the
-- room's last acknowledged writes (an AOF under appendfsync everysec keeps
-- up to a second less than it acknowledged); nodes delivered them and
-- clients saw them, and a node that never delivered them cannot tell
-- them lost. So, unless the node says such a process loses nothing
-- (lossless: AOF with appendfsync always, or a promoted replica whose
-- writes each waited for replicas), the room's first touch by the new
-- process starts a new epoch, as reepoch.lua does: the state stays, the
-- log and its write ids go, and no revision of the lost tail is answered
-- again with other content. The node names the process (cur), which it
-- found when it connected (restart.go): INFO, which Redis's ACLs count
-- as dangerous, is never called here.

-- checkRun starts the new epoch newEpoch of a room (meta at rev, in
-- epoch, checked last by run) when another process checked it last, and
-- records the current one, cur; it returns the epoch after and whether
-- it is new. A meta without run (written by an older build, or by a node
-- that could not tell the process) is adopted; a cur of '' (the node
-- could not tell) changes nothing.
local function checkRun(meta, log, wids, rev, epoch, run, cur, newEpoch, lossless)
  if cur == '' or run == cur then return epoch, false end
  if run and run ~= '' and not lossless then
    redis.call('DEL', log, wids)
    redis.call('HSET', meta, 'epoch', newEpoch, 'events', '0', 'floor', string.format('%d', rev + 1),
      'cum', '0', 'base', '0', 'run', cur)
    return newEpoch, true
  end
  redis.call('HSET', meta, 'run', cur)
  return epoch, false
end
