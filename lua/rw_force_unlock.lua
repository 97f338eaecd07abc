-- Delete a read-write lock whoever holds it, if it is in the given mode, and wake its
-- waiters (Redisson's forceUnlock of a read or a write lock).
-- KEYS[1]  lock hash
-- KEYS[2]  channel: redisson_rwlock:{<name>}
-- ARGV[1]  'read' or 'write': the mode the lock must be in
-- ARGV[2]  message ("0" for read, "1" for write, as Redisson)
-- ARGV[3]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- ARGV[4]  the force unlock's event message, published on KEYS[2] (see force_unlock.lua)
-- Returns 1 when the lock was deleted, 0 when it is free or in the other mode; NOTALOCK,
-- deleting nothing, when the name holds a hash that is not a lock.
--#include lock_shape.lua
local refused = redis.call('exists', KEYS[1]) == 1 and refuse_unless_lock(KEYS[1])
if refused then
    return refused
end
if redis.call('hget', KEYS[1], 'mode') ~= ARGV[1] then
    return 0
end
redis.pcall(ARGV[3], KEYS[2], ARGV[4])
local sent = redis.pcall(ARGV[3], KEYS[2], ARGV[2])
if type(sent) == 'table' and sent.err then
    return redis.error_reply('NOPERM publish refused: ' .. sent.err)
end
redis.call('del', KEYS[1])
return 1
