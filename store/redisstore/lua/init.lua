#!lua
-- init.lua: give a room without meta an epoch, without writing to it.
-- KEYS[1] meta, KEYS[2] kv, KEYS[3] log, KEYS[4] wids; ARGV[1] new epoch,
-- ARGV[2] TTL ms, ARGV[3] the run_id of the Redis process (run.lua). A
-- room whose meta is missing has lost its state (or never had any): any
-- kv, log or write ids left behind are stale and go. The meta of a room
-- that is only read expires after the TTL (the first write makes it
-- permanent).
-- Returns {epoch, rev}.
local m = redis.call('HMGET', KEYS[1], 'rev', 'epoch')
if m[2] then return {m[2], m[1] or '0'} end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
-- The process it is created by checked it (run.lua).
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'rev', '0', 'events', '0', 'floor', '1', 'run', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {ARGV[1], '0'}
