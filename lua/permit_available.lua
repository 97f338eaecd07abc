-- Count the available permits of a permit-expirable semaphore, after giving back every
-- permit whose lease ended (Redisson's availablePermits does the same).
-- KEYS[1]  semaphore: a string holding the number of available permits
-- KEYS[2]  leases: sorted set permit id -> expiry in ms ({<name>}:timeout)
-- KEYS[3]  channel: redisson_sc:{<name>}
-- ARGV[1]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- Returns the count (0 for an absent semaphore). A count above 0 after a give-back is
-- published.
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
    return value
end
local value = redis.call('get', KEYS[1])
if value == false then
    return 0
end
local n = tonumber(value)
if n == nil then
    return redis.error_reply('WRONGTYPE the key does not hold a permit count')
end
return n
