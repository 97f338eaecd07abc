-- A waiter of a fair lock leaves its queue (gave up, or cancelled), or the lock is deleted
-- by force; either way the waiter then first in line is told, if the lock is free.
-- KEYS[1]  lock hash
-- KEYS[2]  queue: redisson_lock_queue:{<name>}
-- KEYS[3]  deadlines: redisson_lock_timeout:{<name>}
-- ARGV[1]  holder field of the waiter that leaves, or '' for none
-- ARGV[2]  '1' to delete the lock (a force unlock), '0' not to
-- ARGV[3]  unlock message ("0")
-- ARGV[4]  'publish' or 'spublish'
-- ARGV[5]  the lock's channel, redisson_lock__channel:{<name>}
-- ARGV[6]  the force unlock's event message, published on ARGV[5] (see force_unlock.lua)
-- ARGV[7]  the wait timeout W in ms (see fair_acquire.lua): each waiter behind the one
--          that leaves is one place nearer the head, and its deadline comes W nearer, as
--          in Redisson's acquireFailed
-- Returns 1 when a lock was deleted, else 0; NOTALOCK, changing nothing, when a force
-- unlock finds a hash that is not a lock.
--#include lock_shape.lua
local refused = ARGV[2] == '1' and redis.call('exists', KEYS[1]) == 1
    and refuse_unless_lock(KEYS[1])
if refused then
    return refused
end
if ARGV[1] ~= '' then
    local queue = redis.call('lrange', KEYS[2], 0, -1)
    local behind = false
    for _, other in ipairs(queue) do
        if behind and redis.call('zscore', KEYS[3], other) then
            redis.call('zincrby', KEYS[3], -tonumber(ARGV[7]), other)
        end
        behind = behind or other == ARGV[1]
    end
    redis.call('lrem', KEYS[2], 0, ARGV[1])
    redis.call('zrem', KEYS[3], ARGV[1])
end
local deleted = 0
if ARGV[2] == '1' and redis.call('type', KEYS[1]).ok == 'hash' then
    redis.call('del', KEYS[1])
    redis.pcall(ARGV[4], ARGV[5], ARGV[6])
    deleted = 1
end
if redis.call('exists', KEYS[1]) == 0 then
    local head = redis.call('lindex', KEYS[2], 0)
    if head then
        redis.call(ARGV[4], ARGV[5] .. ':' .. head, ARGV[3])
    end
end
return deleted
