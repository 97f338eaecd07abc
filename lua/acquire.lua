-- Take or re-enter a lock, at most once per request; a fenced lock also issues a
-- fencing token.
-- KEYS[1]  lock hash (the lock's name)
-- KEYS[2]  fencing token counter: redisson_lock_token:{<name>} (touched only when fenced)
-- KEYS[3]  acquire latch: redisson_acquire_latch:{<name>}:<request id>
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  holder field: "<client uuid>:<owner id>"
-- ARGV[3]  how long the latch is kept, in ms
-- ARGV[4]  '1' when the client knows of no hold of this field (a grant then needs no
--          latch: a retry recognises it by the field alone), '0' otherwise
-- ARGV[5]  '1' when this request was sent before and its reply was lost, '0' the first time
-- ARGV[6]  '1' for a fenced lock (Redisson's RFencedLock: every grant INCRs the counter),
--          '0' for a plain one (Redisson's RLock: the counter is never touched)
-- Returns {1, token, latched} when the caller now holds the lock; for a fenced lock the
-- token is larger than every token issued before for this name, for a plain one it is 0.
-- latched is 1 when the latch was written (the client deletes it once the request has
-- its answer). Returns {0, pttl} when someone else holds it; the PTTL bounds how long a
-- waiter sleeps.
local fenced = ARGV[6] == '1'
if ARGV[5] == '1' then
    local granted = redis.call('get', KEYS[3])
    -- The first send granted, and the hold is still there: the lease is counted from
    -- now, as the client counts it from this send. A hold gone since (expired) is not
    -- granted twice from the latch: the request then asks afresh, below.
    if granted and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
        if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
            redis.call('pexpire', KEYS[1], ARGV[1])
        end
        return {1, tonumber(granted), 1}
    end
    -- The client held nothing, and now it does: the first send ran and granted (or a
    -- hand-over whose reply was lost did). The lease is counted from now, as above.
    if ARGV[4] == '1' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
        if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
            redis.call('pexpire', KEYS[1], ARGV[1])
        end
        local token = 0
        if fenced then
            token = tonumber(redis.call('get', KEYS[2]))
        end
        return {1, token, 0}
    end
end
local fresh = redis.call('exists', KEYS[1]) == 0
if fresh or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local token = 0
    if fenced then
        -- First, because it is the only call here that can fail on a well-formed lock
        -- (a counter of the wrong type, not a number, or not positive after INCR): a
        -- script is not rolled back, so nothing may be written before it is known good.
        token = redis.pcall('incr', KEYS[2])
        if type(token) ~= 'number' or token < 1 then
            return redis.error_reply('BADTOKEN ' .. KEYS[2])
        end
    end
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    -- A re-entry never shortens a lease the holder already has: an inner
    -- short-lease hold must not cut off an outer watchdog hold.
    if fresh or redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    -- A first grant to a client that held nothing is recognised on retry by its field;
    -- anything else (a re-entry) could not be told from an earlier hold, so it is latched.
    if fresh and ARGV[4] == '1' then
        return {1, token, 0}
    end
    redis.call('set', KEYS[3], token, 'px', ARGV[3])
    return {1, token, 1}
end
return {0, redis.call('pttl', KEYS[1])}
