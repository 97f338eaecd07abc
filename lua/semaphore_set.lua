-- Set a semaphore's permits if it does not exist yet (Redisson's trySetPermits; also the
-- permit-expirable semaphore's).
-- KEYS[1]  semaphore: a string holding the number of available permits
-- KEYS[2]  channel: redisson_sc:{<name>}
-- ARGV[1]  permits (0 or more)
-- ARGV[2]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- Returns 1 when the key was set (and the count published if above 0), 0 when it
-- existed (nothing written). A key that is not a count answers WRONGTYPE (Redisson's
-- answers 0).
--#include count_shape.lua
if count_at(KEYS[1]) then
    return 0
end
redis.call('set', KEYS[1], ARGV[1])
if tonumber(ARGV[1]) > 0 then
    redis.call(ARGV[2], KEYS[2], ARGV[1])
end
return 1
