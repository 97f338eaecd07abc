-- Count a latch down by one (Redisson's RCountDownLatch.countDown).
-- KEYS[1]  latch: a string holding the count
-- KEYS[2]  channel: redisson_countdownlatch__channel__{<name>}
-- ARGV[1]  the zero-count message ("0")
-- ARGV[2]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- Returns the count left. At 0 the key is deleted and ARGV[1] published. An absent
-- latch is left absent and answers 0 (Redisson's script writes -1 and deletes it).
--#include count_shape.lua
if count_at(KEYS[1]) == false then
    return 0
end
local v = redis.call('decr', KEYS[1])
if v <= 0 then
    redis.call('del', KEYS[1])
end
if v == 0 then
    redis.call(ARGV[2], KEYS[2], ARGV[1])
end
return math.max(v, 0)
