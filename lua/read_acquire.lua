-- Take or re-enter the read half of a read-write lock (Redisson's RReadWriteLock
-- layout), at most once per request.
-- KEYS[1]  lock hash (the lock's name): field 'mode' = 'read' | 'write', one field per holder
-- KEYS[2]  this holder's timeout key prefix: {<name>}:<field>:rwlock_timeout (hold n has
--          the key <prefix>:<n>, value 1, expiring with that hold's lease)
-- KEYS[3]  acquire latch: redisson_unlock_latch:{<name>}:<request id> (as acquire.lua)
-- KEYS[4]  writers of this crate that wait: redisson_rwlock_writers:{<name>} (ours), a
--          sorted set of write fields scored by when each one's mark ends (server ms)
-- KEYS[5]  readers of this crate that wait: redisson_rwlock_readers:{<name>} (ours), alike
-- KEYS[6]  the readers' turn after a writer: redisson_rwlock_turn:{<name>} (ours), the
--          waiting readers a writer's last unlock found, each leaving it when granted
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  holder field: "<client uuid>:<owner id>" (its write field is that plus ':write')
-- ARGV[3]  how long the latch is kept, in ms
-- ARGV[4]  '1' when the client knows of no read hold of this field and sends no other
--          request of it (holds of the field found here are adopted as they are), '0'
--          otherwise
-- ARGV[5]  '1' when this request was sent before and its reply was lost, '0' the first time
-- ARGV[6]  '1' when the caller waits if it is refused: it marks its field in KEYS[5]
-- ARGV[7]  how long the reader's mark lasts, in ms (the waiter asks again within half)
-- Returns {1, 0, latched} when the caller now holds one more read hold; {0, pttl} when a
-- writer other than the caller holds the lock, or when a writer's mark in KEYS[4] is
-- live and the caller holds no read hold yet (unless it is the readers' turn, KEYS[6]):
-- then the PTTL is the marks' key's.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function waiting()
    if KEYS[5] and ARGV[6] == '1' then
        -- One mark per waiter: a grant takes only its own away, so a reader let in
        -- never clears the mark of another that still waits. Ended marks (a waiter
        -- that went away) are dropped here.
        local ended = redis.call('zrangebyscore', KEYS[5], '-inf', now)
        if #ended > 0 then
            redis.call('zrem', KEYS[5], unpack(ended))
        end
        redis.call('zadd', KEYS[5], now + tonumber(ARGV[7]), ARGV[2])
        if redis.call('pttl', KEYS[5]) < tonumber(ARGV[7]) then
            redis.call('pexpire', KEYS[5], ARGV[7])
        end
    end
end
-- A reader granted waits no more, and has had its turn: only its own mark and name go.
local function holds_now()
    if KEYS[5] then
        redis.call('zrem', KEYS[5], ARGV[2])
    end
    if KEYS[6] then
        redis.call('zrem', KEYS[6], ARGV[2])
    end
end
-- A retry whose first send granted (its latch says so), or a call that knows of no read
-- hold of this field and sends no other request of it, finding the field here anyway:
-- holds nobody took (this request's own first send, an unlock answered too late),
-- adopted as they are, as in acquire.lua. Counted again, the call's unlock would leave
-- them, and writers out, until their timeout keys ran out (issue 24's finding 5). The
-- top hold's timeout key is raised to the lease, never cut (a late delivery of this
-- call must not shorten a newer hold), and made anew if it has run out: the hash's TTL
-- is computed from these keys when another reader leaves. Only in a read-write lock: a
-- plain lock's hold of the same field is no read hold.
local mode = redis.call('hget', KEYS[1], 'mode')
local count = tonumber(redis.call('hget', KEYS[1], ARGV[2]))
local granted = ARGV[5] == '1' and redis.call('get', KEYS[3])
if mode and count and (granted or ARGV[4] == '1') then
    local top = KEYS[2] .. ':' .. count
    local ttl = math.max(redis.call('pttl', top), tonumber(ARGV[1]))
    redis.call('set', top, 1, 'px', string.format('%d', ttl))
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    holds_now()
    if granted then
        return {1, 0, 1}
    end
    return {1, 0, 0}
end
-- A hash the caller has no field in: a plain lock (busy, never to be given a 'mode') or
-- no lock at all (an error: nothing here is ever released).
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
-- New readers let a waiting writer go first, or readers that keep overlapping would keep
-- it out for good. A reader re-entering (or a writer downgrading) is not held back: the
-- writer waits for it anyway. Right after a writer that found readers waiting, it is
-- their turn (KEYS[6]), and they go first: writers that keep coming cannot keep them
-- out for good either. The turn lasts until each reader it was made for is in (or it
-- runs out), not until the readers inside leave: a reader woken by the writer's unlock
-- may ask after others came in on the turn and left.
if KEYS[4] and mode ~= 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 0
    and not (KEYS[6] and redis.call('exists', KEYS[6]) == 1) then
    local marked = redis.call('zrangebyscore', KEYS[4], '(' .. now, '+inf', 'limit', 0, 1)
    if #marked > 0 then
        waiting()
        return {0, redis.call('pttl', KEYS[4])}
    end
end
-- Readers share; the writer may also read (a downgrade), as in Redisson.
if mode == false or mode == 'read'
    or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2] .. ':write') == 1) then
    if mode == false then
        redis.call('hset', KEYS[1], 'mode', 'read')
    end
    holds_now()
    local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('set', KEYS[2] .. ':' .. n, 1, 'px', ARGV[1])
    -- Never shortens the hash's TTL: other holders may have longer leases.
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    -- A first hold of a field the client did not hold is recognised on retry by the
    -- field alone; a further hold could not be told from the earlier ones, so it is latched.
    if n == 1 and ARGV[4] == '1' then
        return {1, 0, 0}
    end
    redis.call('set', KEYS[3], 0, 'px', ARGV[3])
    return {1, 0, 1}
end
waiting()
return {0, redis.call('pttl', KEYS[1])}
