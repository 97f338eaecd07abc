-- Included by the scripts that put a client in a lock's line (docs/protocol.md 2.6).
-- A TTL of at least ms: a place is never cut short by a waiter whose own lease is
-- shorter than another's, and a list emptied by LPOP or LREM and made anew by RPUSH,
-- which has none, gets one. At most 2^62 ms: twice the longest lease (MAX_DURATION) is
-- past what PEXPIRE takes, and formats as a negative number, which deletes the key.
local function keep_for(key, ms)
    ms = math.min(ms, 4611686018427387904)
    if redis.call('pttl', key) < ms then
        redis.call('pexpire', key, string.format('%d', ms))
    end
end
-- The client `me` waits in the line `key` (once), kept for twice the waiter's lease.
local function join_line(key, me, lease)
    if not redis.call('lpos', key, me) then
        redis.call('rpush', key, me)
    end
    keep_for(key, 2 * tonumber(lease))
end
