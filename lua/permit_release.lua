-- Give back permits of a permit-expirable semaphore by id, and any whose lease ended.
-- KEYS[1]  semaphore: a string holding the number of available permits
-- KEYS[2]  leases: sorted set permit id -> expiry in ms ({<name>}:timeout)
-- KEYS[3]  channel: redisson_sc:{<name>}
-- ARGV[1]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- ARGV[2.] permit ids
-- Returns how many of the ids were held with a live lease. An id whose lease had ended
-- is given back too but not counted (Redisson's tryRelease answers false for it); an
-- unknown id changes nothing. The new count is published when above 0.
--#include count_shape.lua
count_at(KEYS[1])
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local back, live = 0, 0
for i = 2, #ARGV do
    local score = redis.call('zscore', KEYS[2], ARGV[i])
    if score then
        redis.call('zrem', KEYS[2], ARGV[i])
        back = back + 1
        if tonumber(score) > now then
            live = live + 1
        end
    end
end
local ended = redis.call('zrangebyscore', KEYS[2], 0, now)
for _, id in ipairs(ended) do
    redis.call('zrem', KEYS[2], id)
end
back = back + #ended
if back > 0 then
    local value = redis.call('incrby', KEYS[1], back)
    if value > 0 then
        redis.call(ARGV[1], KEYS[3], value)
    end
end
return live
