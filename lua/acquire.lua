-- Take or re-enter a lock.
-- KEYS[1]  lock hash (the lock's name)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  holder field: "<client uuid>:<owner id>"
-- Returns nil when the caller now holds the lock, else the lock's PTTL in milliseconds,
-- which bounds how long a waiter sleeps before it tries again.
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    -- A re-entry never shortens a lease the holder already has: an inner
    -- short-lease hold must not cut off an outer watchdog hold.
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return nil
end
return redis.call('pttl', KEYS[1])
