-- Set a latch's count if it does not exist (Redisson's RCountDownLatch.trySetCount).
-- KEYS[1]  latch: a string holding the count
-- KEYS[2]  channel: redisson_countdownlatch__channel__{<name>}
-- ARGV[1]  the new-count message ("1")
-- ARGV[2]  the count (at least 1)
-- ARGV[3]  'publish', or 'spublish' on a cluster with sharded pub/sub
-- Returns 1 when set (and ARGV[1] published), 0 when the latch existed (nothing written).
-- A key that is not a count answers WRONGTYPE (Redisson's answers 0).
--#include count_shape.lua
if count_at(KEYS[1]) then
    return 0
end
redis.call('set', KEYS[1], ARGV[2])
redis.call(ARGV[3], KEYS[2], ARGV[1])
return 1
