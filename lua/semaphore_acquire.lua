-- Take permits of a semaphore (Redisson's RSemaphore), all or none, at most once per
-- request.
-- KEYS[1]  semaphore: a string holding the number of available permits
-- KEYS[2]  request latch: redisson_semaphore_latch:{<name>}:<request id> (this crate's)
-- ARGV[1]  permits wanted (at least 1)
-- ARGV[2]  '1' when this request was sent before and its reply was lost, '0' the first time
-- ARGV[3]  how long the latch is kept, in ms
-- Returns 1 when they were taken (by this send, or by the lost first send of the same
-- request), 0 when fewer are available (an absent key has none). A key that holds no
-- integer answers a WRONGTYPE error and is left as it is.
if ARGV[2] == '1' and redis.call('get', KEYS[2]) then
    -- A write, so that replica sync's WAIT after this retry, which counts only its own
    -- connection's writes, covers the first send's too (see acquire.lua).
    redis.call('pexpire', KEYS[2], ARGV[3])
    return 1
end
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
    redis.call('set', KEYS[2], 1, 'px', ARGV[3])
    return 1
end
return 0
