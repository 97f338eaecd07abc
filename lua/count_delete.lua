-- Delete a semaphore, a permit-expirable semaphore or a latch (Redisson's delete).
-- KEYS[1]  the count: a string holding an integer
-- KEYS[2]  the channel
-- KEYS[3]  optional: the lease set of a permit-expirable semaphore ({<name>}:timeout)
-- ARGV[1]  'publish' or 'spublish' to announce the delete on KEYS[2] (the latch, as
--          Redisson's does), '' for none (the semaphores: Redisson's publishes nothing)
-- ARGV[2]  the message
-- Returns 1 when anything was deleted, 0 when nothing existed. A count key or lease set
-- of another type answers WRONGTYPE and nothing is deleted (Redisson's delete would
-- take any key at the name).
--#include count_shape.lua
count_at(KEYS[1])
if KEYS[3] then
    local t = redis.call('type', KEYS[3])['ok']
    if t ~= 'none' and t ~= 'zset' then
        return redis.error_reply('WRONGTYPE the lease set is not a sorted set')
    end
end
local deleted = redis.call('del', KEYS[1])
if KEYS[3] then
    deleted = deleted + redis.call('del', KEYS[3])
end
if deleted > 0 and ARGV[1] ~= '' then
    redis.call(ARGV[1], KEYS[2], ARGV[2])
end
if deleted > 0 then
    return 1
end
return 0
