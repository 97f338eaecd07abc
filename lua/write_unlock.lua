-- Release write holds of a read-write lock, at most once per request.
-- KEYS[1]  lock hash
-- KEYS[2]  channel: redisson_rwlock:{<name>}
-- KEYS[3]  unlock latch: redisson_unlock_latch:{<name>}:<request id>
-- KEYS[4]  readers of this crate that wait: redisson_rwlock_readers:{<name>} (ours), a
--          sorted set of read fields scored by when each one's mark ends (server ms)
-- KEYS[5]  the readers' turn after a writer: redisson_rwlock_turn:{<name>} (ours)
-- ARGV[1]  message ("1": every waiter may go, readers share)
-- ARGV[2]  lease to set when write holds remain, in ms; 0 leaves the TTL as it is
-- ARGV[3]  write holder field: "<client uuid>:<owner id>:write"
-- ARGV[4]  how long the latch is kept, in ms
-- ARGV[5]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- ARGV[6]  how many holds to release (the client's local re-entries count as one)
-- ARGV[7]  '1' when this request was sent before and its reply was lost, '0' the first time
-- ARGV[8]  how long the readers' turn lasts at most, in ms
-- Returns nil when the caller holds no write hold, 0 when write holds remain (latched
-- '0'), 1 when the last one went (a first send's is not latched: a retry finds the field
-- gone). The message is published whenever the last write hold goes: readers may enter
-- then, also when the writer's own read holds keep the hash (mode turns 'read'). Every
-- send replays a latch it finds, and a retry latches every outcome, as in unlock.lua.
local retry = ARGV[7] == '1'
-- Every send, not only a retry: a late copy of an answered unlock must not release a
-- newer hold of the field (unlock.lua, issue 24's finding 7).
local done = redis.call('get', KEYS[3])
if done then
    if retry then
        -- A write, for replica sync's WAIT (see unlock.lua).
        redis.call('pexpire', KEYS[3], ARGV[4])
    end
    -- 'x' (nothing was held) gives nil.
    return tonumber(done)
end
-- A retry leaves its outcome for the copies still on their way; out of memory it stands
-- without.
local function settle(outcome)
    if retry then
        redis.pcall('set', KEYS[3], outcome, 'px', ARGV[4])
    end
end
if redis.call('hget', KEYS[1], 'mode') ~= 'write' then
    settle('x')
    return nil
end
local count = tonumber(redis.call('hget', KEYS[1], ARGV[3]))
if count == nil then
    settle('x')
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
else
    -- The writer's own read holds remain (a downgrade).
    redis.call('hset', KEYS[1], 'mode', 'read')
end
-- Readers of this crate wait: theirs is the next turn, not another writer's. The turn
-- names them, and lasts until each is in (or ARGV[8] ms): readers that come meanwhile
-- and leave do not end it before a woken reader has asked.
if KEYS[5] then
    local t = redis.call('time')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local waiting = redis.call('zrangebyscore', KEYS[4], '(' .. now, '+inf')
    redis.call('del', KEYS[4])
    if #waiting > 0 then
        local named = {}
        for _, f in ipairs(waiting) do
            named[#named + 1] = 0
            named[#named + 1] = f
        end
        redis.call('zadd', KEYS[5], unpack(named))
        redis.call('pexpire', KEYS[5], ARGV[8])
    end
end
settle('1')
return 1
