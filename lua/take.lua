-- Take a plain lock on a call's first send, when the client knows of no hold of the field
-- and sends no other request of it, and the client is not in the line (docs/protocol.md
-- 2.1): the uncontended call, as small as Redisson's acquire. Every other acquire of a
-- plain lock (a retry, a fenced lock, a waiter whose client is in line) is acquire.lua's.
-- KEYS[1]  lock hash (the lock's name)
-- KEYS[2]  clients waiting for the lock: redisson_lock_clients:{<name>}, and
-- KEYS[3]  whose turn it is: redisson_lock_turn:{<name>}; both named only by a caller that
--          waits with turns on. A single try names neither: like Redisson's tryLock() it
--          takes a free lock whoever's turn it is, and never joins the line.
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  holder field: "<client uuid>:<owner id>"
-- Returns nil when the caller now holds the lock, the lock's PTTL when someone else holds
-- it (as Redisson's script does), or {0, pttl, 1} when it is free but another client's
-- turn (the turn's PTTL). No latch: a retry of a grant finds it by the field alone.
local free = redis.call('exists', KEYS[1]) == 0
local turn = free and KEYS[3] and redis.call('get', KEYS[3])
if free and not turn then
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
-- The helpers come after the free lock's path, which needs none of them: the server
-- makes a function anew each time the script reaches its definition.
--#include lock_shape.lua
--#include line.lua
if free then
    local me = string.sub(ARGV[2], 1, 36)
    if turn ~= me then
        -- A release gave the next turn to the client first in line: wait for it to
        -- take the lock, in line, at most until the turn runs out. Every turn is set
        -- with its window: a value without a TTL is no turn (foreign data), and would
        -- hold every waiting call off for ever.
        local left = redis.call('pttl', KEYS[3])
        if left > 0 then
            join_line(KEYS[2], me, ARGV[1])
            return {0, left, 1}
        end
    else
        -- This client's own turn, with none of its waiters left in line: used up.
        redis.call('del', KEYS[3])
    end
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    -- A hold of the field nobody took (an earlier send's reply lost, a hand-over its
    -- waiter left, an unlock answered too late): adopted as it is, as acquire.lua's 'f'
    -- does, with the lease counted from now and a longer TTL kept.
    local ttl = math.max(redis.call('pttl', KEYS[1]), tonumber(ARGV[1]))
    redis.call('pexpire', KEYS[1], string.format('%d', ttl))
    return nil
end
-- Busy: by a holder, or by data that is no lock (then nobody would ever release it).
if is_lock(KEYS[1]) == false then
    return not_a_lock(KEYS[1])
end
if KEYS[2] then
    join_line(KEYS[2], string.sub(ARGV[2], 1, 36), ARGV[1])
end
return redis.call('pttl', KEYS[1])
