-- Take permits of a semaphore (Redisson's RSemaphore), all or none.
-- KEYS[1]  semaphore: a string holding the number of available permits
-- ARGV[1]  permits wanted (at least 1)
-- Returns 1 when they were taken, 0 when fewer are available (an absent key has none).
-- A key that holds no integer answers a WRONGTYPE error and is left as it is.
local value = redis.call('get', KEYS[1])
if value == false then
    return 0
end
local available = tonumber(value)
if available == nil then
    return redis.error_reply('WRONGTYPE the key does not hold a permit count')
end
if available >= tonumber(ARGV[1]) then
    redis.call('decrby', KEYS[1], ARGV[1])
    return 1
end
return 0
