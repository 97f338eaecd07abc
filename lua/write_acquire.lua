-- Take or re-enter the write half of a read-write lock (Redisson's RReadWriteLock
-- layout), at most once per request.
-- KEYS[1]  lock hash (the lock's name): field 'mode' = 'read' | 'write', one field per holder
-- KEYS[2]  acquire latch: redisson_unlock_latch:{<name>}:<request id> (as acquire.lua)
-- KEYS[3]  writers of this crate that wait: redisson_rwlock_writers:{<name>} (ours), a
--          sorted set of write fields scored by when each one's mark ends (server ms)
-- KEYS[4]  the readers' turn after a writer: redisson_rwlock_turn:{<name>} (ours)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  write holder field: "<client uuid>:<owner id>:write"
-- ARGV[3]  how long the latch is kept, in ms
-- ARGV[4]  '1' when the client knows of no write hold of this field and sends no other
--          request of it (a hold of the field found here is adopted as is), '0' otherwise
-- ARGV[5]  '1' when this request was sent before and its reply was lost, '0' the first time
-- ARGV[6]  '1' when the caller waits if the lock is busy: it marks its field in KEYS[3]
--          for ARGV[7] ms, which holds back new readers of this crate until it is in
-- ARGV[7]  how long the mark lasts, in ms (the waiter asks again within half of it)
-- Returns {1, 0, latched} when the caller now holds one more write hold; {0, pttl} when
-- it is the readers' turn (the PTTL is the turn's), or when anyone else holds the lock,
-- readers included (the caller's own read holds too: an
-- upgrade is refused by the client before it gets here).
-- A writer granted waits no more: its own mark goes, and only its own (below).
local function holds_now()
    if KEYS[3] then
        redis.call('zrem', KEYS[3], ARGV[2])
    end
end
-- A retry whose first send granted (its latch says so), or a call that knows of no
-- write hold of this field and sends no other request of it, finding the field here
-- anyway: a hold nobody took (this request's own first send, an unlock answered too
-- late), adopted as it is, as in acquire.lua. Counted again, it would leave the lock held
-- by nobody after the call's unlock (issue 24's finding 5).
local granted = ARGV[5] == '1' and redis.call('get', KEYS[2])
if (granted or ARGV[4] == '1') and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    -- Always a write, the TTL kept where it is longer (see acquire.lua).
    redis.call('pexpire', KEYS[1], string.format('%d', math.max(redis.call('pttl', KEYS[1]), tonumber(ARGV[1]))))
    holds_now()
    if granted then
        return {1, 0, 1}
    end
    return {1, 0, 0}
end
-- One mark per waiting writer (see read_acquire.lua): a writer let in takes away its own
-- only, so another writer's grant never lets new readers pass a writer still waiting.
local function waiting()
    if KEYS[3] and ARGV[6] == '1' then
        local t = redis.call('time')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        local ended = redis.call('zrangebyscore', KEYS[3], '-inf', now)
        if #ended > 0 then
            redis.call('zrem', KEYS[3], unpack(ended))
        end
        redis.call('zadd', KEYS[3], now + tonumber(ARGV[7]), ARGV[2])
        if redis.call('pttl', KEYS[3]) < tonumber(ARGV[7]) then
            redis.call('pexpire', KEYS[3], ARGV[7])
        end
    end
end
local mode = redis.call('hget', KEYS[1], 'mode')
-- As in read_acquire.lua: a plain lock is busy, a hash that is no lock an error.
if redis.call('exists', KEYS[1]) == 1 and redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
--#include lock_shape.lua
    if is_lock(KEYS[1]) == false then
        return not_a_lock(KEYS[1])
    end
    if mode == false then
        waiting()
        return {0, redis.call('pttl', KEYS[1])}
    end
end
if mode == false and KEYS[4] then
    local turn = redis.call('pttl', KEYS[4])
    if turn > 0 then
        waiting()
        return {0, turn}
    end
end
if mode == false then
    holds_now()
    redis.call('hset', KEYS[1], 'mode', 'write', ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    if ARGV[4] == '1' then
        return {1, 0, 0}
    end
    redis.call('set', KEYS[2], 0, 'px', ARGV[3])
    return {1, 0, 1}
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    -- A re-entry never shortens the lease (Redisson adds the lease to the PTTL instead).
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    redis.call('set', KEYS[2], 0, 'px', ARGV[3])
    return {1, 0, 1}
end
waiting()
return {0, redis.call('pttl', KEYS[1])}
