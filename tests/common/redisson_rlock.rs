//! Redisson's own `RLock` scripts, typed here from their description in words (see
//! `shared/notes/redisson-facts.md` 1.2 and 1.3), for the tests, benches and checker
//! that play a Redisson peer.

/// `RedissonLock.tryLockInnerAsync`: KEYS[1] lock; ARGV[1] lease ms, ARGV[2] field.
pub const ACQUIRE: &str = r#"
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
return redis.call('pttl', KEYS[1])
"#;

/// `RedissonLock.unlockInnerAsync`: KEYS lock, channel, latch; ARGV message, lease,
/// field, publish command, latch TTL.
pub const UNLOCK: &str = r#"
local done = redis.call('get', KEYS[3])
if done ~= false then
    return tonumber(done)
end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
end
local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    redis.call('set', KEYS[3], 0, 'px', ARGV[5])
    return 0
end
redis.call('del', KEYS[1])
redis.call(ARGV[4], KEYS[2], ARGV[1])
redis.call('set', KEYS[3], 1, 'px', ARGV[5])
return 1
"#;
