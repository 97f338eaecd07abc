-- Take or re-enter a lock, and issue a fencing token; at most once per request id.
-- KEYS[1]  lock hash (the lock's name)
-- KEYS[2]  fencing token counter: redisson_lock_token:{<name>}
-- KEYS[3]  acquire latch: redisson_acquire_latch:{<name>}:<request id>
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  holder field: "<client uuid>:<owner id>"
-- ARGV[3]  how long the latch is kept, in ms
-- Returns {1, token} when the caller now holds the lock; the token is larger than every
-- token issued before for this name. Returns {0, pttl} when someone else holds it; the
-- PTTL bounds how long a waiter sleeps before it tries again. A retry with the same
-- request id (its first reply was lost) gets the first grant again instead of a second
-- hold; the unlock of that hold deletes the latch.
local granted = redis.call('get', KEYS[3])
if granted then
    return {1, tonumber(granted)}
end
local fresh = redis.call('exists', KEYS[1]) == 0
if fresh or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    -- First, because it is the only call here that can fail on a well-formed lock (a
    -- counter key of the wrong type): a script is not rolled back, so nothing may be
    -- written before it.
    local token = redis.call('incr', KEYS[2])
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    -- A re-entry never shortens a lease the holder already has: an inner
    -- short-lease hold must not cut off an outer watchdog hold.
    if fresh or redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    redis.call('set', KEYS[3], token, 'px', ARGV[3])
    return {1, token}
end
return {0, redis.call('pttl', KEYS[1])}
