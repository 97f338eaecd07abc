-- Included by the scripts that release a plain lock (docs/protocol.md 2.2, 2.6).
-- How long the client whose turn comes with a subscriber outside the line (a Redisson
-- waiter, which the line cannot hold) leaves the lock to it: its turn lasts this much
-- longer than the window, and its acquire is answered busy until only the window is
-- left (acquire.lua; take.lua serves no client in line, which a turn is given to). Redis counts a PTTL in whole ms from the command's ms,
-- so that is 1 to 2 ms of real time: a loopback or LAN round trip is well within it.
local YIELD_MS = 2
-- The last hold's release, published with `publish` on `channel`; `line` and `turn` are
-- false with turns off. The first client in the line gets the turn for `window` ms (its
-- sign: whether the releasing client listens on `channel`, see others_listen), and
-- leaves the line; the releasing client (`field`'s) at its front goes to the back
-- instead, and the turn to the client after it. Returns nil, or the error reply when the
-- publish was refused. A write that only the turn needs goes through `redis.pcall`, its
-- refusal ignored: out of memory ('maxmemory', 'noeviction') Redis refuses it, and the
-- release must then go on as a plain published one, which writes nothing that could be
-- refused. Nothing in line (the common release) reads no more than the line's head.
local function publish_release(hash, channel, line, turn, field, window, publish)
    -- Foreign data at the line's key (no list) gives no line: the release goes on as
    -- with turns off, where an error would leave the hold to run out with its lease.
    local next_client = line and redis.pcall('lindex', line, 0)
    if type(next_client) ~= 'string' then
        next_client = false
    end
    local yields, me, ms = false, nil, nil
    if next_client then
        me = string.sub(field, 1, 36)
        -- With turns off there is no window, and no line to give a turn from.
        ms = tonumber(window) or 0
        if next_client == me then
            -- This client's own run of hand-overs ended with its waiters still in
            -- line: a turn of its own would only hold the others off while its waiters
            -- hold back.
            local second = redis.call('lindex', line, 1)
            if second then
                -- The list keeps at least one entry, so it keeps its TTL.
                redis.call('lpop', line)
                redis.pcall('rpush', line, me)
            end
            next_client = second
        end
    end
    -- The turn is named before the unlock message, on the lock's own channel, so that
    -- a subscriber gets both in this order on one subscription. Redisson's subscribers
    -- decode every message there as an integer and act only on 0 and 1, so the client
    -- is named by a number: 2^48 plus the first 48 bits of its id (its first 12 hex
    -- digits). From 2^49 on, the number also asks that client to let a subscriber from
    -- outside the line try first (a Redisson waiter, which the line cannot hold). It is
    -- only a hint, so a refusal is ignored.
    if next_client then
        -- Whether `channel` has a subscriber that is neither a client in `line` nor `me`
        -- (when the window is positive: a client in line listens, the releasing one only
        -- if it said so) nor marked as a client of this crate: a Redisson waiter, or a
        -- client of this crate with turns off (neither stands in line). A count the server will not give is taken as no: the
        -- turn goes on as before. Written out here, not as a function: one defined in
        -- this function would keep five of its locals as upvalues, each an allocation.
        local counts = redis.pcall('pubsub',
            publish == 'spublish' and 'shardnumsub' or 'numsub', channel)
        if type(counts) == 'table' and not counts.err then
            local known = redis.call('llen', line)
            if ms > 0 and not redis.call('lpos', line, me) then
                known = known + 1
            end
            yields = tonumber(counts[2]) > known
            if yields and publish == 'publish' then
                -- A listening client of this crate marks the channel in the sharded
                -- namespace, where nothing is published on one server: no more plain
                -- subscribers than marks are all such clients, lingering ones included.
                -- A client that cannot mark (an old server, an ACL) still counts.
                local marks = redis.pcall('pubsub', 'shardnumsub', channel)
                if type(marks) == 'table' and not marks.err then
                    yields = tonumber(counts[2]) > tonumber(marks[2])
                end
            end
        end
        local bits = tonumber(string.sub(next_client, 1, 8) .. string.sub(next_client, 10, 13), 16)
        if bits then
            local base = 281474976710656
            if yields then
                base = 562949953421312
            end
            redis.pcall(publish, channel, string.format('%.0f', base + bits))
        end
    end
    -- PUBLISH before any write: a publish refused by ACL then leaves the lock as it was,
    -- instead of a lock released that no waiter hears of. The refusal is given the
    -- NOPERM code: servers word it differently, and Redis 7.0 reports it as a plain ERR.
    local sent = redis.pcall(publish, channel, '0')
    if type(sent) == 'table' and sent.err then
        return redis.error_reply('NOPERM publish refused: ' .. sent.err)
    end
    redis.call('del', hash)
    if next_client then
        redis.call('lpop', line)
        -- Only a hint for the waiters (2.6): out of memory, the release stands without it.
        -- A turn that yields first lasts YIELD_MS longer, which its client's acquire
        -- reads as its first part (acquire.lua).
        local lasts = math.abs(ms)
        if yields then
            lasts = lasts + YIELD_MS
        end
        redis.pcall('set', turn, next_client, 'px', string.format('%d', lasts))
    end
    return nil
end
