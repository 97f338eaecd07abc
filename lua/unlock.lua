-- Release one hold of a lock, at most once per request id.
-- KEYS[1]  lock hash
-- KEYS[2]  unlock channel: redisson_lock__channel:{<name>}
-- KEYS[3]  unlock latch: redisson_unlock_latch:{<name>}:<request id>
-- KEYS[4]  the acquire latch of the hold being released (deleted: its retries are over)
-- ARGV[1]  unlock message ("0")
-- ARGV[2]  lease to set when holds remain, in ms; 0 leaves the TTL as it is
-- ARGV[3]  holder field
-- ARGV[4]  how long the latch is kept, in ms
-- ARGV[5]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- Returns nil when the caller holds nothing, 0 when holds remain, 1 when the lock was
-- released. A retry with the same request id (its first reply was lost) gets the first
-- outcome again instead of counting down twice.
local done = redis.call('get', KEYS[3])
if done then
    return tonumber(done)
end
local count = tonumber(redis.call('hget', KEYS[1], ARGV[3]))
if count == nil then
    return nil
end
if count > 1 then
    redis.call('hincrby', KEYS[1], ARGV[3], -1)
    if tonumber(ARGV[2]) > 0 then
        redis.call('pexpire', KEYS[1], ARGV[2])
    end
    redis.call('del', KEYS[4])
    redis.call('set', KEYS[3], 0, 'px', ARGV[4])
    return 0
end
-- PUBLISH before any write: a publish refused by ACL then leaves the lock as it was,
-- instead of a lock released that no waiter hears of.
redis.call(ARGV[5], KEYS[2], ARGV[1])
redis.call('del', KEYS[1], KEYS[4])
redis.call('set', KEYS[3], 1, 'px', ARGV[4])
return 1
