-- Take or re-enter a fair lock (Redisson's RFairLock layout), in the order of its queue.
-- KEYS[1]  lock hash (the lock's name)
-- KEYS[2]  queue of waiting holder fields, first in line first: redisson_lock_queue:{<name>}
-- KEYS[3]  each waiter's deadline in ms since the epoch: redisson_lock_timeout:{<name>};
--          a waiter at the head of the queue whose deadline has passed is taken as gone
-- KEYS[4]  acquire latch: redisson_unlock_latch:{<name>}:<request id> (as acquire.lua)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  holder field: "<client uuid>:<owner id>"
-- ARGV[3]  the wait timeout W in ms, Redisson's fairLockWaitTimeout (threadWaitTime): a
--          joiner's deadline is the last waiter's + W, and a grant takes W off every other
--          deadline, as in Redisson's scripts. A waiter of this crate asks again within W/3,
--          and each time its deadline is raised to at least now + W per place it stands
--          from the head, so that the grants ahead of it before it asks again leave it in
--          the future (a live waiter is never taken as gone)
-- ARGV[4]  how long the latch is kept, in ms
-- ARGV[5]  '1' when the client knows of no hold of this field and sends no other request
--          of it (a hold of the field found here is adopted as is), '0' otherwise
-- ARGV[6]  '1' when this request was sent before and its reply was lost
-- ARGV[7]  '1' when the caller waits: it joins the queue (or keeps its place) if it cannot
--          take the lock now; '0' for a single try, which never joins
-- Returns {1, 0, latched} when the caller now holds the lock (latched as in acquire.lua),
-- {0, wait_ms} when not: the lock's PTTL, or, when the lock is free but another waiter is
-- first in line, how long until that waiter would be taken as gone.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local field = ARGV[2]
-- A retry whose first send granted (its latch says so), or a call that knows of no hold
-- of this field and sends no other request of it, finding the field here anyway: a hold
-- nobody took, adopted as it is, as in acquire.lua (counted again, it would leave the
-- lock held by nobody after the call's unlock: issue 24's finding 5). The queue is left
-- as a re-entry leaves it.
local granted = ARGV[6] == '1' and redis.call('get', KEYS[4])
if (granted or ARGV[5] == '1') and redis.call('hexists', KEYS[1], field) == 1 then
    -- Always a write, the TTL kept where it is longer (see acquire.lua).
    redis.call('pexpire', KEYS[1], string.format('%d', math.max(redis.call('pttl', KEYS[1]), tonumber(ARGV[1]))))
    return {1, 0, granted and 1 or 0}
end
-- Waiters at the head whose deadline passed are gone (crashed, or gave up unheard).
while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then
        break
    end
    local deadline = tonumber(redis.call('zscore', KEYS[3], head))
    if deadline and deadline > now then
        break
    end
    redis.call('lpop', KEYS[2])
    redis.call('zrem', KEYS[3], head)
end
local head = redis.call('lindex', KEYS[2], 0)
if redis.call('exists', KEYS[1]) == 0 then
    if not head or head == field then
        if head then
            redis.call('lpop', KEYS[2])
        end
        redis.call('zrem', KEYS[3], field)
        -- Each waiter left is one place nearer the head (Redisson's ZINCRBY).
        local wait = tonumber(ARGV[3])
        for _, other in ipairs(redis.call('zrangebyscore', KEYS[3], '-inf', '+inf')) do
            redis.call('zincrby', KEYS[3], -wait, other)
        end
        redis.call('hset', KEYS[1], field, 1)
        redis.call('pexpire', KEYS[1], ARGV[1])
        if ARGV[5] == '1' then
            return {1, 0, 0}
        end
        redis.call('set', KEYS[4], 0, 'px', ARGV[4])
        return {1, 0, 1}
    end
elseif redis.call('hexists', KEYS[1], field) == 1 then
    redis.call('hincrby', KEYS[1], field, 1)
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    redis.call('set', KEYS[4], 0, 'px', ARGV[4])
    return {1, 0, 1}
else
--#include lock_shape.lua
    if is_lock(KEYS[1]) == false then
        return not_a_lock(KEYS[1])
    end
end
if ARGV[7] == '1' then
    local wait = tonumber(ARGV[3])
    local deadline = tonumber(redis.call('zscore', KEYS[3], field))
    local place = redis.call('lpos', KEYS[2], field)
    if not deadline then
        -- Joins as Redisson's acquire does: W after the last waiter's deadline, or after
        -- the lock's PTTL when nobody waits.
        local last = redis.call('lindex', KEYS[2], -1)
        local after = last and last ~= field and redis.call('zscore', KEYS[3], last)
        if after then
            deadline = tonumber(after) + wait
        else
            deadline = now + redis.call('pttl', KEYS[1]) + wait
        end
    end
    if not place then
        redis.call('rpush', KEYS[2], field)
        place = redis.call('llen', KEYS[2]) - 1
        head = head or field
    end
    -- Never lowered: a Redisson waiter that joins behind gets this + W, as behind one of
    -- its own.
    deadline = math.max(deadline, now + (place + 1) * wait)
    redis.call('zadd', KEYS[3], string.format('%d', deadline), field)
end
local wait = redis.call('pttl', KEYS[1])
if wait < 0 then
    wait = 0
    if head and head ~= field then
        wait = math.max(0, tonumber(redis.call('zscore', KEYS[3], head) or now) - now)
    end
end
return {0, wait}
