-- Release read holds of a read-write lock, at most once per request.
-- KEYS[1]  lock hash
-- KEYS[2]  channel: redisson_rwlock:{<name>}
-- KEYS[3]  unlock latch: redisson_unlock_latch:{<name>}:<request id>
-- KEYS[4]  this holder's timeout key prefix: {<name>}:<field>:rwlock_timeout
-- KEYS[5]  the prefix of every holder's timeout keys: {<name>}
-- ARGV[1]  message ("0": one waiter per client may go)
-- ARGV[2]  holder field
-- ARGV[3]  how long the latch is kept, in ms
-- ARGV[4]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- ARGV[5]  how many holds to release (the client's local re-entries count as one)
-- ARGV[6]  '1' when this request was sent before and its reply was lost, '0' the first time
-- Returns nil when the caller holds no read hold, 0 when the field keeps holds (latched
-- '0'), 1 when the field's last hold went (a first send's is not latched: a retry finds
-- the field gone). The hash is deleted and the message published when no other holder
-- is left. Every send replays a latch it finds, and a retry latches every outcome ('x'
-- for nothing held), as in unlock.lua.
local retry = ARGV[6] == '1'
-- Every send, not only a retry: a late copy of an answered unlock must not release a
-- newer hold of the field (unlock.lua, issue 24's finding 7).
local done = redis.call('get', KEYS[3])
if done then
    if retry then
        -- A write, for replica sync's WAIT (see unlock.lua).
        redis.call('pexpire', KEYS[3], ARGV[3])
    end
    return tonumber(done)
end
-- A retry leaves its outcome for the copies still on their way; out of memory it stands
-- without.
local function settle(outcome)
    if retry then
        redis.pcall('set', KEYS[3], outcome, 'px', ARGV[3])
    end
end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    settle('x')
    return nil
end
local count = tonumber(redis.call('hget', KEYS[1], ARGV[2]))
if count == nil then
    settle('x')
    return nil
end
local n = math.min(tonumber(ARGV[5]), count)
for i = count, count - n + 1, -1 do
    redis.call('del', KEYS[4] .. ':' .. i)
end
local left = count - n
if left > 0 then
    redis.call('hincrby', KEYS[1], ARGV[2], -n)
else
    redis.call('hdel', KEYS[1], ARGV[2])
end
local out = 1
if left > 0 then
    out = 0
end
if redis.call('hlen', KEYS[1]) > 1 then
    -- Other holders remain: the hash lives as long as the longest read hold left.
    local longest = -3
    for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
        local c = tonumber(redis.call('hget', KEYS[1], field))
        if c then
            for i = c, 1, -1 do
                local ttl = redis.call('pttl', KEYS[5] .. ':' .. field .. ':rwlock_timeout:' .. i)
                longest = math.max(longest, ttl)
            end
        end
    end
    if longest > 0 or mode == 'write' then
        if longest > 0 then
            redis.call('pexpire', KEYS[1], longest)
        end
        if left > 0 then
            redis.call('set', KEYS[3], out, 'px', ARGV[3])
        else
            settle('1')
        end
        return out
    end
end
-- Nobody is left. PUBLISH before the delete: a publish refused by ACL leaves the lock
-- as it was rather than released with nobody told.
local sent = redis.pcall(ARGV[4], KEYS[2], ARGV[1])
if type(sent) == 'table' and sent.err then
    return redis.error_reply('NOPERM publish refused: ' .. sent.err)
end
redis.call('del', KEYS[1])
settle('1')
return 1
