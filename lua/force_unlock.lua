-- Delete a lock whoever holds it, and wake its waiters.
-- KEYS[1]  lock hash
-- KEYS[2]  unlock channel
-- ARGV[1]  unlock message ("0")
-- ARGV[2]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- ARGV[3]  the force unlock's event message, an integer (Redisson's subscribers act only
--          on 0 and 1), which tells `rlock watch` that the release right behind it was
--          forced
-- Returns 1 when a lock was deleted, 0 when there was none; WRONGTYPE or NOTALOCK,
-- deleting nothing, when the key is not a lock (another type, or a hash of other fields).
--#include lock_shape.lua
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
    return 0
end
if kind ~= 'hash' then
    return redis.error_reply('WRONGTYPE the key is not a lock hash; force unlock deletes only locks')
end
local refused = refuse_unless_lock(KEYS[1])
if refused then
    return refused
end
-- The event goes first, so that an observer knows why before it hears the release.
redis.pcall(ARGV[2], KEYS[2], ARGV[3])
-- PUBLISH before DEL: if ACL refuses it, nothing has been deleted. Servers word that
-- refusal differently and Redis 7.0 gives it no code of its own, so it is given one.
local sent = redis.pcall(ARGV[2], KEYS[2], ARGV[1])
if type(sent) == 'table' and sent.err then
    return redis.error_reply('NOPERM publish refused: ' .. sent.err)
end
redis.call('del', KEYS[1])
return 1
