-- Give permits to a semaphore (Redisson's RSemaphore) and wake its waiters.
-- KEYS[1]  semaphore: a string holding the number of available permits
-- KEYS[2]  channel: redisson_sc:{<name>}
-- ARGV[1]  permits to give; may be negative with ARGV[3] = 'add'
-- ARGV[2]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- ARGV[3]  'release': only into an existing semaphore;
--          'add': Redisson's addPermits (an absent key counts as 0; a TTL goes)
-- Returns the new number of available permits as a string (exact over the whole 64-bit
-- range, which a Lua number is not), or nil when ARGV[3] is 'release' and the semaphore
-- does not exist (nothing written). A sum outside the 64-bit range is refused with an
-- OVERFLOW error, nothing written. The new count is published, as Redisson does, but
-- only when it is above 0 (a Redisson waiter cannot take a negative count).
local value = redis.call('get', KEYS[1])
if value ~= false and value ~= '0' and not string.match(value, '^-?[1-9]%d*$') then
    return redis.error_reply('WRONGTYPE the key does not hold a permit count')
end
if value == false and ARGV[3] ~= 'add' then
    return nil
end
-- INCRBY does the sum in 64-bit integers and refuses an overflow, where Redisson's
-- Lua addition would store a rounded float.
local r = redis.pcall('incrby', KEYS[1], ARGV[1])
if type(r) == 'table' and r.err then
    return redis.error_reply('OVERFLOW the permit count would leave the 64-bit range')
end
if ARGV[3] == 'add' then
    redis.call('persist', KEYS[1])
end
local now = redis.call('get', KEYS[1])
if r > 0 then
    redis.call(ARGV[2], KEYS[2], now)
end
return now
