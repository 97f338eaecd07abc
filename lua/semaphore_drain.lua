-- Take every available permit of a semaphore (Redisson's drainPermits).
-- KEYS[1]  semaphore: a string holding the number of available permits
-- Returns the count it held (0 for an absent key, which stays absent); the key is set
-- to 0 (SET, so a TTL goes, as with Redisson).
local value = redis.call('get', KEYS[1])
if value == false then
    return 0
end
local available = tonumber(value)
if available == nil then
    return redis.error_reply('WRONGTYPE the key does not hold a permit count')
end
redis.call('set', KEYS[1], 0)
return available
