-- Take or re-enter a lock, at most once per request; a fenced lock also issues a
-- fencing token.
-- KEYS[1]  lock hash (the lock's name)
-- KEYS[2]  acquire latch: redisson_unlock_latch:{<name>}:<request id> (request ids are
--          never shared, so acquire and unlock latches share the name)
-- KEYS[3]  clients waiting for the lock, oldest first: redisson_lock_clients:{<name>}
-- KEYS[4]  whose turn it is to take the lock after a release: redisson_lock_turn:{<name>}
-- KEYS[5]  fencing token counter: redisson_lock_token:{<name>}; sent with 'F' only (a
--          plain lock never names it)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  holder field: "<client uuid>:<owner id>"
-- ARGV[3]  how long the latch is kept, in ms
-- ARGV[4]  turn window in ms; '0' leaves KEYS[3] and KEYS[4] alone (turns off). A
--          client is known in them by its id, the first 36 characters of ARGV[2]
-- ARGV[5]  flags, one letter each, present when true (one argument, not five: each
--          argument costs the server about as much as a command):
--          'f' the client knows of no hold of this field, and sends no other request of
--              it now: a hold of the field found here is one nobody took, adopted as is
--              (a grant then needs no latch: a retry recognises it by the field alone)
--          'r' this request was sent before and its reply was lost
--          'F' a fenced lock (Redisson's RFencedLock: every grant INCRs the counter); a
--              plain one (Redisson's RLock) never touches the counter
--          'w' the caller waits if the lock is busy: the client then joins KEYS[3]
--          'k' or 'l': what a first grant does to the client's place in KEYS[3]: keep it
--              (other waiters of the client remain: it stays, or joins again at the back
--              after using its turn) or leave (its last waiter in line); neither: the
--              client is not in line
-- Returns {1, token, latched} when the caller now holds the lock; for a fenced lock the
-- token is larger than every token issued before for this name, for a plain one it is 0.
-- latched is 1 when the latch was written (the client deletes it once the request has
-- its answer). A plain lock's fresh first grant, {1, 0, 0}, is sent as nil instead: the
-- common reply, and a table costs the server about as much as a command to build and
-- send. Returns {0, pttl} when someone else holds it, or {0, pttl, 1} when it is free but
-- it is another client's turn (then the PTTL is the turn's), or this client's turn in its
-- first millisecond, which it yields to a subscriber outside the line (then the PTTL is
-- what is left of that millisecond); the PTTL bounds how long a waiter sleeps. With turns on, a client whose caller waits joins KEYS[3] once when it
-- finds the lock busy, and a first grant takes it out again.
local flags = ARGV[5]
-- Each flag read by a direct call: a call of a Lua helper per flag cost the server more
-- than the search itself.
local find = string.find
local knows_none = find(flags, 'f', 1, true) ~= nil
local fenced = find(flags, 'F', 1, true) ~= nil
local line = find(flags, 'k', 1, true) and 'keep' or (find(flags, 'l', 1, true) and 'leave' or '')
-- The lease counted from now, a longer TTL kept. Always a write, even where it keeps the
-- TTL: it makes the WAIT after this call (replica sync), which counts only this
-- connection's writes, cover the first send's grant too, sent maybe on another
-- connection.
local function lease_from_now()
    local ttl = math.max(redis.call('pttl', KEYS[1]), tonumber(ARGV[1]))
    redis.call('pexpire', KEYS[1], string.format('%d', ttl))
end
-- The next fencing token, or the error to answer: BADTOKEN when the counter itself can
-- give none (the wrong type, not an integer, at the 64-bit end, not positive after
-- INCR); the server's own refusal of a sound counter's INCR (out of memory, an ACL) as
-- it is, since deleting a sound counter, as BADTOKEN tells an operator to, would issue
-- tokens again from 1. Made only for a fenced lock: a function costs every run.
local draw_token
if fenced then
    draw_token = function()
        local token = redis.pcall('incr', KEYS[5])
        if type(token) == 'number' and token >= 1 then
            return token, nil
        end
        local v = redis.pcall('get', KEYS[5])
        local sound = v == false or (type(v) == 'string' and #v < 19
            and (v == '0' or string.find(v, '^[1-9]%d*$') ~= nil))
        if type(token) == 'table' and sound then
            return nil, token
        end
        return nil, redis.error_reply('BADTOKEN ' .. KEYS[5])
    end
end
if find(flags, 'r', 1, true) then
    local granted = redis.call('get', KEYS[2])
    -- The first send granted, and the hold is still there: the lease is counted from
    -- now, as the client counts it from this send. A hold gone since (expired) is not
    -- granted twice from the latch: the request then asks afresh, below.
    if granted and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
        lease_from_now()
        return {1, tonumber(granted), 1}
    end
end
-- The client knows of no hold of this field, and no other request of it is in flight,
-- yet the hash has one: a hold nobody took. It is this request's own first send (its
-- reply lost), a hand-over whose waiter stopped waiting for it, or an unlock answered too
-- late. Nobody else can have been granted while it lasts, so the call adopts it as its
-- first hold, as it is: counting it again would leave it held by nobody after the call's
-- unlock. Not cutting its count or its TTL keeps a late delivery of this request harmless
-- to a newer hold of the field. The lease is counted from now, as above. A fenced call
-- draws a token of its own, as every fenced grant does: the leftover may be a plain
-- lock's, which drew none (the counter may not even exist), and the counter's value is
-- then the token of an earlier holder; a token nobody took is simply skipped.
local fresh = redis.call('exists', KEYS[1]) == 0
if knows_none and not fresh and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local token, refused = 0, nil
    if fenced then
        -- First, before any write, as below.
        token, refused = draw_token()
        if refused then
            return refused
        end
    end
    lease_from_now()
    return {1, token, 0}
end
local turns = tonumber(ARGV[4] or '0') > 0
local waits = find(flags, 'w', 1, true) ~= nil
local me = string.sub(ARGV[2], 1, 36)
--#include line.lua
local function wait_in_line()
    join_line(KEYS[3], me, ARGV[1])
end
local turn = false
if fresh and turns and waits then
    -- A release gave the next turn to the client first in line: the others' waiters
    -- wait for it to take the lock, at most until the turn runs out. A single try (no
    -- 'w') takes a free lock as a Redisson client's does: it never joins the line, so a
    -- turn of its own would never come, and a try_lock() loop would starve.
    turn = redis.call('get', KEYS[4])
    if turn and turn ~= me then
        -- A value without a TTL is no turn (every turn has its window): foreign data,
        -- which would hold every waiting call off for ever. Nor is one longer than a
        -- peer with this client's window sets (the window, plus YIELD_MS for a yield):
        -- foreign data again, or a peer with a longer window, which the clients of a
        -- name are told not to mix; waiting it out kept the free lock from every
        -- waiter for all its TTL
        -- (adv_yield::a_long_lived_turn_of_a_gone_client_does_not_hold_a_waiter_off).
        local left = redis.call('pttl', KEYS[4])
        if left > 0 and left <= tonumber(ARGV[4]) + 2 then
            wait_in_line()
            return {0, left, 1}
        end
        turn = false
    elseif turn and redis.call('exists', KEYS[1]) == 0 then
        -- This client's turn, given while a subscriber outside the line listened (a
        -- Redisson waiter): it is set YIELD_MS past the window (published.lua), and
        -- its first part is that subscriber's. Redis counts a PTTL in whole ms. Only
        -- up to YIELD_MS is read as that part: a turn set by a client with a longer
        -- window, or written by someone else with a long TTL, would otherwise keep
        -- this client off a free lock for all it lasts beyond this window
        -- (adv_yield::a_turn_given_with_a_longer_window_is_not_refused_to_its_own_client).
        local early = redis.call('pttl', KEYS[4]) - tonumber(ARGV[4])
        if early > 0 and early <= 2 then
            return {0, early, 1}
        end
    end
end
if fresh or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local token, refused = 0, nil
    if fenced then
        -- First, because it is the only call here that can fail on a well-formed lock:
        -- a script is not rolled back, so nothing may be written before it is known good.
        token, refused = draw_token()
        if refused then
            return refused
        end
    end
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    -- A re-entry never shortens a lease the holder already has: an inner
    -- short-lease hold must not cut off an outer watchdog hold.
    if fresh or redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    -- The grant is written and a script is not rolled back: the line's bookkeeping
    -- below goes through pcall, so that foreign data at the line's key cannot turn a
    -- grant into an error reply that leaves its hold to nobody.
    if turn then
        -- This client's turn is used. The release took it out of the line, but a busy
        -- answer since (a Redisson client took the lock first) may have put it back.
        redis.call('del', KEYS[4])
        if line == 'keep' then
            pcall(wait_in_line)
        elseif line == 'leave' then
            redis.pcall('lrem', KEYS[3], 1, me)
        end
    elseif fresh and turns and line == 'leave' then
        redis.pcall('lrem', KEYS[3], 1, me)
    elseif fresh and turns and line == 'keep' then
        pcall(wait_in_line)
    end
    -- A first grant to a client that held nothing is recognised on retry by its field;
    -- anything else (a re-entry) could not be told from an earlier hold, so it is latched.
    if fresh and knows_none then
        if token == 0 then
            return nil
        end
        return {1, token, 0}
    end
    redis.call('set', KEYS[2], token, 'px', ARGV[3])
    return {1, token, 1}
end
-- Busy: by a holder, or by data that is no lock (then nobody would ever release it).
--#include lock_shape.lua
if is_lock(KEYS[1]) == false then
    return not_a_lock(KEYS[1])
end
if turns and waits then
    wait_in_line()
end
return {0, redis.call('pttl', KEYS[1])}
