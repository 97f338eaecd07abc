-- Release write holds of a read-write lock, at most once per request.
-- KEYS[1]  lock hash
-- KEYS[2]  channel: redisson_rwlock:{<name>}
-- KEYS[3]  unlock latch: redisson_unlock_latch:{<name>}:<request id>
-- KEYS[4]  a reader of this crate waits: redisson_rwlock_reader:{<name>} (this crate's)
-- KEYS[5]  the readers' turn after a writer: redisson_rwlock_readturn:{<name>} (ours)
-- ARGV[1]  message ("1": every waiter may go, readers share)
-- ARGV[2]  lease to set when write holds remain, in ms; 0 leaves the TTL as it is
-- ARGV[3]  write holder field: "<client uuid>:<owner id>:write"
-- ARGV[4]  how long the latch is kept, in ms
-- ARGV[5]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- ARGV[6]  how many holds to release (the client's local re-entries count as one)
-- ARGV[7]  '1' when this request was sent before and its reply was lost, '0' the first time
-- ARGV[8]  how long the readers' turn lasts at most, in ms
-- Returns nil when the caller holds no write hold, 0 when write holds remain (latched
-- '0'), 1 when the last one went (not latched: a retry finds the field gone). The
-- message is published whenever the last write hold goes: readers may enter then, also
-- when the writer's own read holds keep the hash (mode turns 'read').
if ARGV[7] == '1' then
    local done = redis.call('get', KEYS[3])
    if done then
        return tonumber(done)
    end
end
if redis.call('hget', KEYS[1], 'mode') ~= 'write' then
    return nil
end
local count = tonumber(redis.call('hget', KEYS[1], ARGV[3]))
if count == nil then
    return nil
end
local n = tonumber(ARGV[6])
if count > n then
    redis.call('hincrby', KEYS[1], ARGV[3], -n)
    if tonumber(ARGV[2]) > 0 then
        redis.call('pexpire', KEYS[1], ARGV[2])
    end
    redis.call('set', KEYS[3], 0, 'px', ARGV[4])
    return 0
end
-- PUBLISH before any write (see unlock.lua).
local sent = redis.pcall(ARGV[5], KEYS[2], ARGV[1])
if type(sent) == 'table' and sent.err then
    return redis.error_reply('NOPERM publish refused: ' .. sent.err)
end
redis.call('hdel', KEYS[1], ARGV[3])
if redis.call('hlen', KEYS[1]) == 1 then
    redis.call('del', KEYS[1])
    -- Readers of this crate wait: theirs is the next turn, not another writer's.
    if KEYS[5] and redis.call('del', KEYS[4]) == 1 then
        redis.call('set', KEYS[5], 1, 'px', ARGV[8])
    end
else
    -- The writer's own read holds remain (a downgrade).
    redis.call('hset', KEYS[1], 'mode', 'read')
end
return 1
