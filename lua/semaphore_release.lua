-- Give permits to a semaphore (Redisson's RSemaphore) and wake its waiters.
-- KEYS[1]  semaphore: a string holding the number of available permits
-- KEYS[2]  channel: redisson_sc:{<name>}
-- ARGV[1]  permits to give; may be negative with ARGV[3] = 'add'
-- ARGV[2]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- ARGV[3]  'release': only into an existing semaphore (INCRBY);
--          'add': Redisson's addPermits (an absent key counts as 0; SET, so a TTL goes)
-- Returns the new number of available permits, or nil when ARGV[3] is 'release' and the
-- semaphore does not exist (nothing written). The new count is published, as Redisson
-- does, but only when it is above 0 (a Redisson waiter cannot take a negative count).
local value = redis.call('get', KEYS[1])
if value ~= false and tonumber(value) == nil then
    return redis.error_reply('WRONGTYPE the key does not hold a permit count')
end
local now
if ARGV[3] == 'add' then
    now = (tonumber(value) or 0) + tonumber(ARGV[1])
    redis.call('set', KEYS[1], now)
else
    if value == false then
        return nil
    end
    now = redis.call('incrby', KEYS[1], ARGV[1])
end
if now > 0 then
    redis.call(ARGV[2], KEYS[2], now)
end
return now
