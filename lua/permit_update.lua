-- Give a held permit of a permit-expirable semaphore a new lease, counted from now.
-- KEYS[1]  semaphore: a string holding the number of available permits
-- KEYS[2]  leases: sorted set permit id -> expiry in ms ({<name>}:timeout)
-- KEYS[3]  channel: redisson_sc:{<name>}
-- ARGV[1]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- ARGV[2]  permit id
-- ARGV[3]  new lease in ms
-- Returns 1 when the permit was held (its lease is now ARGV[3] from the server's now),
-- 0 when it is unknown or its lease had ended (it is given back then, with every
-- other ended lease, and the new count published when above 0).
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
if redis.call('zscore', KEYS[2], ARGV[2]) then
    redis.call('zadd', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
    return 1
end
return 0
