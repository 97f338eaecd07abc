-- Release holds of a lock, at most once per request; on a full release, optionally hand
-- the lock over to a waiter of the same client instead of publishing.
-- KEYS[1]  lock hash
-- KEYS[2]  unlock channel: redisson_lock__channel:{<name>}
-- KEYS[3]  unlock latch: redisson_unlock_latch:{<name>}:<request id>
-- KEYS[4]  clients waiting for the lock, oldest first: redisson_lock_clients:{<name>}
-- KEYS[5]  whose turn it is to take the lock: redisson_lock_turn:{<name>}
-- KEYS[6]  fencing token counter: redisson_lock_token:{<name>}; sent with 'F' only
-- ARGV[1]  lease to set when holds remain, in ms; 0 leaves the TTL as it is
-- ARGV[2]  holder field
-- ARGV[3]  how long the latch is kept, in ms
-- ARGV[4]  how many holds to release (the client's local re-entries count as one)
-- ARGV[5]  holder field of the next holder to hand over to, or '' to publish
-- ARGV[6]  the next holder's lease, in ms
-- ARGV[7]  turn window in ms: a published release gives the first client in KEYS[4] the
--          turn for this long, and names it on KEYS[2] by its turn number just before the
--          unlock message (so other clients' waiters can let it go first without
--          asking); '0' leaves KEYS[4] and KEYS[5] alone
-- ARGV[8]  flags, one letter each, present when true:
--          'r' this request was sent before and its reply was lost
--          'F' a fenced lock (a hand-over INCRs the token counter)
--          'g' the hand-over to ARGV[5] gives way to another client waiting in KEYS[4]
--              (this client has handed over several times in a row): the release is
--              then published with that client's turn, and this client, which still
--              has waiters, goes to the back of the line
--          's' publish with SPUBLISH (a cluster with sharded pub/sub), else PUBLISH
--          'e' the hand-over to ARGV[5] comes at the end of this client's run of them
--              (its window is over): it goes ahead only if no one else may be waiting,
--              that is no other client in KEYS[4] and no subscriber of KEYS[2] but this
--              client; else the release is published, as without ARGV[5]
-- The unlock message is Redisson's, "0".
-- Returns nil when the caller holds nothing, 0 when holds remain, 1 when the lock was
-- released and published, 3 when it was published because the hand-over gave way (the
-- flag 'g'), {2, token} when it was handed over to ARGV[5] (with a new fencing token for
-- a fenced lock, 0 for a plain one). A partial release latches '0' and a hand-over
-- 'h<token>'; a first send's full release latches nothing: a retry finds the field gone,
-- which the client reads as "released". A retry latches every outcome ('x' for nothing
-- held), and every send replays a latch it finds instead of acting again.
-- A write that only a hand-over or a hint needs: out of memory ('maxmemory',
-- 'noeviction') Redis refuses it, and the release must then go on as a plain published
-- one, which writes nothing that could be refused. Whether it was written.
local function try_write(...)
    local reply = redis.pcall(...)
    return not (type(reply) == 'table' and reply.err)
end
local flags = ARGV[8]
local function flag(letter)
    return string.find(flags, letter, 1, true) ~= nil
end
local publish = flag('s') and 'spublish' or 'publish'
local me = string.sub(ARGV[2], 1, 36)
local retry = flag('r')
-- Every send reads its latch first, not only a retry: a copy of this request delivered
-- late (a dead connection's buffer, flushed after a retry was answered on another
-- connection) must not release a newer hold of the same field (issue 24's finding 7).
local done = redis.call('get', KEYS[3])
if done then
    if retry then
        -- A write, so that the WAIT after this call (replica sync), which counts only
        -- this connection's writes, covers the first send's writes too: the retry may
        -- go out on another connection than the first send did.
        redis.call('pexpire', KEYS[3], ARGV[3])
    end
    if string.sub(done, 1, 1) == 'h' then
        return {2, tonumber(string.sub(done, 2))}
    end
    -- 'x' (nothing was held) gives nil.
    return tonumber(done)
end
-- A retry leaves its outcome in the latch, whatever it is, for the copies of this request
-- still on their way. Only a guard against them: out of memory the outcome stands without.
local function settle(outcome)
    if retry then
        try_write('set', KEYS[3], outcome, 'px', ARGV[3])
    end
end
local count = tonumber(redis.call('hget', KEYS[1], ARGV[2]))
if count == nil then
    settle('x')
    return nil
end
local n = tonumber(ARGV[4])
if count > n then
    redis.call('hincrby', KEYS[1], ARGV[2], -n)
    if tonumber(ARGV[1]) > 0 then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    redis.call('set', KEYS[3], 0, 'px', ARGV[3])
    return 0
end
local turns = tonumber(ARGV[7] or '0') > 0
-- The first two clients in the line. Foreign data at its key (no list) gives none: it
-- must not fail the release, which would leave the hold to run out with its lease.
local function first_in_line()
    local first = redis.pcall('lrange', KEYS[4], 0, 1)
    if first.err then
        return {}
    end
    return first
end
local gave_way = false
if ARGV[5] ~= '' and flag('g') and turns then
--#include line.lua
    local first = first_in_line()
    if (first[1] and first[1] ~= me) or first[2] then
        -- Another client waits: its turn comes before this client's next hand-over.
        -- Back in line even if the client was not there: its waiters need a place.
        redis.call('lrem', KEYS[4], 1, me)
        if try_write('rpush', KEYS[4], me) then
            keep_for(KEYS[4], 2 * tonumber(ARGV[6]))
        end
        gave_way = true
    end
end
-- Whether anyone but this client may wait for the lock: another client in line, or a
-- second subscriber of the lock's channel (a Redisson waiter, a client of this crate with
-- turns off). A count the server will not give, or does not believe, is taken as yes.
local function others_wait()
    if turns then
        local first = first_in_line()
        if (first[1] and first[1] ~= me) or first[2] then
            return true
        end
    end
    local counts = redis.pcall('pubsub', flag('s') and 'shardnumsub' or 'numsub', KEYS[2])
    return type(counts) ~= 'table' or counts.err or tonumber(counts[2]) > 1
end
local run_over = ARGV[5] ~= '' and flag('e') and others_wait()
if ARGV[5] ~= '' and not gave_way and not run_over then
    -- For a fenced lock INCR first: it is the one call that can fail (see acquire.lua),
    -- and a script is not rolled back. A counter that cannot fence the next holder makes
    -- this a published release instead; the waiter's own acquire then reports it.
    local token = 0
    if flag('F') then
        token = redis.pcall('incr', KEYS[6])
        if type(token) ~= 'number' or token < 1 then
            token = nil
        end
    end
    -- The new holder's field first: if a write is refused here (ACL, out of memory),
    -- the lock is not deleted with nobody told; the release is published instead.
    if token and try_write('hset', KEYS[1], ARGV[5], 1) then
        -- The next holder may be this very field: a hold given back in the background
        -- (a cancelled acquire's grant) while a later call of the same task sleeps on the
        -- name. The field then stays, with one hold, for that call.
        if ARGV[5] ~= ARGV[2] then
            redis.call('hdel', KEYS[1], ARGV[2])
        end
        redis.call('pexpire', KEYS[1], ARGV[6])
        -- Only this latch tells a retry that the hand-over happened: the next holder's
        -- field could also have been written by an acquire of its own still in flight.
        redis.call('set', KEYS[3], 'h' .. token, 'px', ARGV[3])
        return {2, token}
    end
end
--#include published.lua
local refused = publish_release(KEYS[1], KEYS[2], turns and KEYS[4], turns and KEYS[5],
    ARGV[2], ARGV[7], publish)
if refused then
    return refused
end
if gave_way then
    settle('3')
    return 3
end
settle('1')
return 1
