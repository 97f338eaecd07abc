-- Extend the leases of many held locks at once (the watchdog's batch).
-- KEYS[i]    lock hash number i
-- ARGV[1]    lease in ms
-- ARGV[i+1]  holder field expected in KEYS[i]
-- Returns a list: 1 where the holder still owns the lock and its lease was extended,
-- 0 where the key is gone, is owned by someone else, or no longer is a hash.
local out = {}
for i = 1, #KEYS do
    -- pcall: a key replaced by another type must cost only its own entry, not the batch.
    if redis.pcall('hexists', KEYS[i], ARGV[i + 1]) == 1 then
        redis.call('pexpire', KEYS[i], ARGV[1])
        out[i] = 1
    else
        out[i] = 0
    end
end
return out
