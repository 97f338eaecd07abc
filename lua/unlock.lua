-- Release one hold of a lock.
-- KEYS[1]  lock hash
-- KEYS[2]  unlock channel: redisson_lock__channel:{<name>}
-- ARGV[1]  unlock message ("0")
-- ARGV[2]  lease to set when holds remain, in ms; 0 leaves the TTL as it is
-- ARGV[3]  holder field
-- Returns nil when the caller holds nothing, 0 when holds remain, 1 when the lock was released.
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
end
local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
    if tonumber(ARGV[2]) > 0 then
        redis.call('pexpire', KEYS[1], ARGV[2])
    end
    return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
