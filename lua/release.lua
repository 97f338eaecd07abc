-- Give back holds of a plain lock on a call's first send, with nobody to hand it over to
-- (docs/protocol.md 2.2): the common unlock. A hand-over, a fenced lock and a retry are
-- unlock.lua's. `publish` (PUBLISH, or SPUBLISH on a cluster with sharded pub/sub) is
-- set by the line the client puts before this text.
-- KEYS[1]  lock hash
-- KEYS[2]  unlock channel: redisson_lock__channel:{<name>}
-- KEYS[3]  unlock latch: redisson_unlock_latch:{<name>}:<request id>
-- KEYS[4]  clients waiting for the lock: redisson_lock_clients:{<name>}, and
-- KEYS[5]  whose turn it is: redisson_lock_turn:{<name>}; both named only with turns on
-- ARGV[1]  holder field
-- ARGV[2]  how many holds to give back (the client's local re-entries count as one)
-- ARGV[3]  lease to set when holds remain, in ms; 0 leaves the TTL as it is
-- ARGV[4]  how long the latch is kept, in ms
-- ARGV[5]  turn window in ms (with KEYS[4] and KEYS[5]): a published release gives the
--          first client in the line the turn for this long. Negative when this client
--          does not listen on the lock's channel: the release then counts every
--          subscriber not in the line as one from outside it (docs/protocol.md 2.6)
-- Returns nil when the caller holds nothing, 0 when holds remain (latched '0'), 1 when
-- the lock was released and published (not latched: a retry finds the field gone).
-- A copy delivered late finds the latch of a retry that ran before it, and replays it
-- instead of releasing a newer hold of the same field (issue 24's finding 7).
local done = redis.call('get', KEYS[3])
if done then
    -- 'x' (nothing was held) gives nil.
    return tonumber(done)
end
local count = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if count == nil then
    return nil
end
local n = tonumber(ARGV[2])
if count > n then
    redis.call('hincrby', KEYS[1], ARGV[1], -n)
    if tonumber(ARGV[3]) > 0 then
        redis.call('pexpire', KEYS[1], ARGV[3])
    end
    redis.call('set', KEYS[3], 0, 'px', ARGV[4])
    return 0
end
--#include published.lua
local refused = publish_release(KEYS[1], KEYS[2], KEYS[4] or false, KEYS[5] or false,
    ARGV[1], ARGV[5], publish)
if refused then
    return refused
end
return 1
