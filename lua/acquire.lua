-- Take or re-enter a lock, and issue a fencing token.
-- KEYS[1]  lock hash (the lock's name)
-- KEYS[2]  fencing token counter: redisson_lock_token:{<name>}
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  holder field: "<client uuid>:<owner id>"
-- Returns {1, token} when the caller now holds the lock; the token is larger than every
-- token issued before for this name. Returns {0, pttl} when someone else holds it; the
-- PTTL bounds how long a waiter sleeps before it tries again.
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    -- First, because it is the only call here that can fail on a well-formed lock (a
    -- counter key of the wrong type): a script is not rolled back, so nothing may be
    -- written before it.
    local token = redis.call('incr', KEYS[2])
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    -- A re-entry never shortens a lease the holder already has: an inner
    -- short-lease hold must not cut off an outer watchdog hold.
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return {1, token}
end
return {0, redis.call('pttl', KEYS[1])}
