#!lua
-- retain.lua: retention of a room's log, the head of apply.lua and
-- trim.lua (store.go sends each with this file before it).
--
-- entryBytes is what an entry of log costs beyond its batch and write id
-- in the bytes retention counts (its ID, fields and stream node share).
local entryBytes = 64

-- entryCum is the c field of an entry's fields: the bytes logged before
-- it; nil for an entry written by a build without byte retention, which
-- is never dropped for bytes (it goes by events or age, as it would have).
local function entryCum(f)
  for j = 1, #f, 2 do
    if f[j] == 'c' then return tonumber(f[j + 1]) end
  end
  return nil
end

-- retain drops whole revisions from the oldest of log while more than
-- maxev events are retained (total), more than maxbytes bytes (cum, the
-- bytes ever logged, less the oldest entry's c), the oldest is older than
-- cutoff (unix ms, nil for none) or below floor, and takes their write
-- ids out of wids. The head revision rev always stays in the log (a node
-- that missed it can still read it); when it too is dropped, floor moves
-- past it and readers treat it as compacted. Entries are read page at a
-- time (the first page of that many) and trimmed with one XTRIM. Returns
-- the new total and floor, the oldest revision retained (rev + 1: none)
-- and the c of its entry (cum: none; 0 when it has none, so that the next
-- write reads the log again until such entries are gone).
local function retain(log, wids, rev, total, floor, maxev, cutoff, page, cum, maxbytes)
  local from, keep, oldest, base = '-', nil, rev + 1, cum
  while true do
    local es = redis.call('XRANGE', log, from, '+', 'COUNT', page)
    page = 100
    if #es == 0 then break end
    local gone, stop = {}, false
    for _, e in ipairs(es) do
      local r = tonumber(string.match(e[1], '^(%d+)'))
      local en, et, ew, ec = 0, 0, nil, nil
      local f = e[2]
      for j = 1, #f, 2 do
        if f[j] == 'n' then en = tonumber(f[j + 1]) elseif f[j] == 't' then et = tonumber(f[j + 1])
        elseif f[j] == 'c' then ec = tonumber(f[j + 1]) elseif f[j] == 'w' then ew = f[j + 1] end
      end
      if not (r < floor or total > maxev or (ec and cum - ec > maxbytes) or (cutoff and et < cutoff)) then
        oldest, base, stop = r, ec or 0, true
        break
      end
      if r >= floor then total = total - en end
      if r >= rev then
        floor, total, base, stop = rev + 1, 0, cum, true
        break
      end
      keep = r + 1
      if ew then gone[#gone + 1] = ew end
      from = '(' .. e[1]
    end
    if #gone > 0 then redis.call('ZREM', wids, unpack(gone)) end
    if stop then break end
  end
  if keep then redis.call('XTRIM', log, 'MINID', string.format('%d', keep)) end
  return total, floor, oldest, base
end

