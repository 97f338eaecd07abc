-- Renew the leases of held permits of a permit-expirable semaphore: the watchdog's
-- batch for the permits of one semaphore (permit_update.lua for many ids at once).
-- KEYS[1]  semaphore: a string holding the number of available permits
-- KEYS[2]  leases: sorted set permit id -> expiry in ms ({<name>}:timeout)
-- KEYS[3]  channel: redisson_sc:{<name>}
-- ARGV[1]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- ARGV[2]  new lease in ms
-- ARGV[3.] permit ids
-- Returns one integer per id: 1 when it was held (its lease is now ARGV[2] from the
-- server's now), 0 when it is unknown or its lease had ended. Ended leases are given
-- back first, as every permit script does, so an ended lease is never revived; only
-- the scores of live ids change.
--#include count_shape.lua
count_at(KEYS[1])
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ended = redis.call('zrangebyscore', KEYS[2], 0, now)
if #ended > 0 then
    for _, id in ipairs(ended) do
        redis.call('zrem', KEYS[2], id)
    end
    local value = redis.call('incrby', KEYS[1], #ended)
    if value > 0 then
        redis.call(ARGV[1], KEYS[3], value)
    end
end
local expires = now + tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
    if redis.call('zscore', KEYS[2], ARGV[i]) then
        redis.call('zadd', KEYS[2], expires, ARGV[i])
        out[#out + 1] = 1
    else
        out[#out + 1] = 0
    end
end
return out
