-- Take permits of a permit-expirable semaphore (Redisson's RPermitExpirableSemaphore),
-- all or none, each under its own id with a lease.
-- KEYS[1]  semaphore: a string holding the number of available permits
-- KEYS[2]  leases: a sorted set, permit id -> expiry in ms since the epoch
--          ({<name>}:timeout); 922337203685477 marks a permit without a lease
-- KEYS[3]  channel: redisson_sc:{<name>}
-- ARGV[1]  permits wanted (at least 1; as many ids follow)
-- ARGV[2]  lease in ms
-- ARGV[3]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- ARGV[4.] permit ids (16 bytes each)
-- Returns {1, 0} when the permits were taken, {0, ms} when fewer are available and the
-- earliest lease ends in ms, {0, -1} when fewer are available and no lease will end.
-- Time is the server's (TIME), never a client's clock. Leases that have ended are given
-- back first (all of them; the new count is published when above 0).
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
        redis.call(ARGV[3], KEYS[3], value)
    end
end
local value = redis.call('get', KEYS[1])
local wanted = tonumber(ARGV[1])
if value ~= false and tonumber(value) == nil then
    return redis.error_reply('WRONGTYPE the key does not hold a permit count')
end
if value ~= false and tonumber(value) >= wanted then
    redis.call('decrby', KEYS[1], wanted)
    local expires = now + tonumber(ARGV[2])
    for i = 4, #ARGV do
        redis.call('zadd', KEYS[2], expires, ARGV[i])
    end
    -- The leases live as long as the semaphore (Redisson copies the TTL the same way).
    local ttl = redis.call('pttl', KEYS[1])
    if ttl > 0 then
        redis.call('pexpire', KEYS[2], ttl)
    end
    return {1, 0}
end
local first = redis.call('zrangebyscore', KEYS[2], '-inf', '(922337203685477', 'withscores', 'limit', 0, 1)
if first[2] ~= nil then
    return {0, math.max(0, tonumber(first[2]) - now)}
end
return {0, -1}
