-- Extend the leases of many read holds at once (the watchdog's batch for read locks;
-- Redisson #1604: the hold's timeout keys are renewed with the hash).
-- KEYS[2i-1] lock hash number i
-- KEYS[2i]   its holder's timeout key prefix: {<name>}:<field>:rwlock_timeout
-- ARGV[1]    lease in ms
-- ARGV[i+1]  holder field expected in KEYS[2i-1]
-- Returns a list: 1 where the holder still has read holds and they (and the hash) were
-- extended, 0 where the field is gone or the key no longer is a hash.
local out = {}
for i = 1, #KEYS / 2 do
    local hash, prefix = KEYS[2 * i - 1], KEYS[2 * i]
    -- pcall: a key replaced by another type must cost only its own entry, not the batch.
    local count = tonumber(redis.pcall('hget', hash, ARGV[i + 1]))
    if count then
        for c = count, 1, -1 do
            redis.call('pexpire', prefix .. ':' .. c, ARGV[1])
        end
        -- Never shortens the hash's TTL: another holder may have a longer lease.
        if redis.call('pttl', hash) < tonumber(ARGV[1]) then
            redis.call('pexpire', hash, ARGV[1])
        end
        out[i] = 1
    else
        out[i] = 0
    end
end
return out
