//! Redisson's own scripts for the family, typed in from their logic (Redisson 4.7:
//! `RedissonSemaphore`, `RedissonPermitExpirableSemaphore`, `RedissonCountDownLatch`,
//! `RedissonReadLock`, `RedissonWriteLock`, `RedissonFairLock`;
//! `/work/shared/notes/redisson-facts.md` 4.1, 4.2, 4.7-4.9). Key and argument orders
//! are this file's own; each actor passes them so.

/// `tryAcquire(n)`. KEYS: semaphore. ARGV: n. 1 when taken.
pub const SEM_ACQUIRE: &str = r"
local value = redis.call('get', KEYS[1])
if value ~= false and tonumber(value) >= tonumber(ARGV[1]) then
  redis.call('decrby', KEYS[1], ARGV[1])
  return 1
end
return 0
";

/// `release(n)`. KEYS: semaphore, channel. ARGV: n. Publishes the new count.
pub const SEM_RELEASE: &str = r"
local value = redis.call('incrby', KEYS[1], ARGV[1])
redis.call('publish', KEYS[2], value)
return value
";

/// `tryAcquire(lease)` of the permit-expirable semaphore. KEYS: semaphore, timeout set,
/// channel. ARGV: n, expiry (the client's clock + lease), the client's now, ids. Ended
/// leases (at most n of them) are given back first. 1 when taken.
pub const PERMIT_ACQUIRE: &str = r"
local expired = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3], 'limit', 0, ARGV[1])
if #expired > 0 then
  redis.call('zrem', KEYS[2], unpack(expired))
  local count = redis.call('incrby', KEYS[1], #expired)
  if tonumber(count) > 0 then redis.call('publish', KEYS[3], count) end
end
local value = redis.call('get', KEYS[1])
if value ~= false and tonumber(value) >= tonumber(ARGV[1]) then
  redis.call('decrby', KEYS[1], ARGV[1])
  for i = 4, #ARGV do
    redis.call('zadd', KEYS[2], ARGV[2], ARGV[i])
  end
  return 1
end
return 0
";

/// `tryRelease(id)`. KEYS: semaphore, timeout set, channel. ARGV: id, the client's now.
/// 1 when the id was held with a live lease.
pub const PERMIT_RELEASE: &str = r"
local ends = redis.call('zscore', KEYS[2], ARGV[1])
if redis.call('zrem', KEYS[2], ARGV[1]) ~= 1 then
  return 0
end
local value = redis.call('incrby', KEYS[1], 1)
redis.call('publish', KEYS[3], value)
if tonumber(ends) <= tonumber(ARGV[2]) then
  return 0
end
return 1
";

/// `countDown()`. KEYS: latch, channel. Publishes `0` when it reaches zero.
pub const LATCH_COUNT_DOWN: &str = r"
local v = redis.call('decr', KEYS[1])
if v <= 0 then
  redis.call('del', KEYS[1])
end
if v == 0 then
  redis.call('publish', KEYS[2], '0')
end
";

/// Read lock acquire. KEYS: hash, this holder's timeout prefix. ARGV: lease, field,
/// write field. nil when granted, else the PTTL.
pub const READ_ACQUIRE: &str = r"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':1', 1)
  redis.call('pexpire', KEYS[2] .. ':1', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':' .. n, 1)
  redis.call('pexpire', KEYS[2] .. ':' .. n, ARGV[1])
  redis.call('pexpire', KEYS[1], math.max(redis.call('pttl', KEYS[1]), ARGV[1]))
  return nil
end
return redis.call('pttl', KEYS[1])
";

/// Read lock release. KEYS: hash, channel, this holder's timeout prefix, every holder's
/// prefix. ARGV: message `0`, field.
pub const READ_UNLOCK: &str = r"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('publish', KEYS[2], ARGV[1])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
  return nil
end
local c = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if c == 0 then
  redis.call('hdel', KEYS[1], ARGV[2])
end
redis.call('del', KEYS[3] .. ':' .. (c + 1))
if redis.call('hlen', KEYS[1]) > 1 then
  local longest = -3
  for _, f in ipairs(redis.call('hkeys', KEYS[1])) do
    local k = tonumber(redis.call('hget', KEYS[1], f))
    if type(k) == 'number' then
      for i = k, 1, -1 do
        longest = math.max(longest, redis.call('pttl', KEYS[4] .. ':' .. f .. ':rwlock_timeout:' .. i))
      end
    end
  end
  if longest > 0 then
    redis.call('pexpire', KEYS[1], longest)
    return 0
  end
  if mode == 'write' then
    return 0
  end
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
";

/// Write lock acquire. KEYS: hash. ARGV: lease, write field. nil when granted, else
/// the PTTL.
pub const WRITE_ACQUIRE: &str = r"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], redis.call('pttl', KEYS[1]) + ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])
";

/// Write lock release. KEYS: hash, channel. ARGV: message `1`, lease, write field.
pub const WRITE_UNLOCK: &str = r"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('publish', KEYS[2], ARGV[1])
  return nil
end
if mode ~= 'write' or redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
  return nil
end
local c = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if c > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('hdel', KEYS[1], ARGV[3])
if redis.call('hlen', KEYS[1]) == 1 then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[2], ARGV[1])
else
  redis.call('hset', KEYS[1], 'mode', 'read')
end
return 1
";

/// `RedissonFairLock`'s purge of the queue, the head of each script below: drops heads
/// whose deadline is at or before `now` (a head without a deadline stops the loop).
/// KEYS[2] queue, KEYS[3] deadlines.
macro_rules! fair_purge {
    () => {
        r#"
local function purge(now)
  while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if head == false then break end
    local t = redis.call('zscore', KEYS[3], head)
    if t == false or tonumber(t) > now then break end
    redis.call('zrem', KEYS[3], head)
    redis.call('lpop', KEYS[2])
  end
end
"#
    };
}

/// The fair lock's `tryLockInnerAsync` (`EVAL_LONG`; `RedissonFairLock` at 66863978,
/// `/work/shared/notes/redisson-facts.md` 4.1): KEYS lock, queue, deadlines; ARGV lease,
/// field, wait, now. nil when taken; else the PTTL (already queued) or the time until
/// the waiter before it is due (joining).
pub const FAIR_ACQUIRE: &str = concat!(
    fair_purge!(),
    r#"
local now = tonumber(ARGV[4])
purge(now)
if redis.call('exists', KEYS[1]) == 0 and
   (redis.call('exists', KEYS[2]) == 0 or redis.call('lindex', KEYS[2], 0) == ARGV[2]) then
  redis.call('lpop', KEYS[2])
  redis.call('zrem', KEYS[3], ARGV[2])
  local rest = redis.call('zrange', KEYS[3], 0, -1)
  for i = 1, #rest do redis.call('zincrby', KEYS[3], -tonumber(ARGV[3]), rest[i]) end
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if redis.call('zscore', KEYS[3], ARGV[2]) ~= false then
  return math.max(0, redis.call('pttl', KEYS[1]))
end
local last = redis.call('lindex', KEYS[2], -1)
local ttl
if last ~= false and last ~= ARGV[2] and redis.call('zscore', KEYS[3], last) ~= false then
  ttl = tonumber(redis.call('zscore', KEYS[3], last)) - now
else
  ttl = redis.call('pttl', KEYS[1])
end
if redis.call('zadd', KEYS[3], ttl + tonumber(ARGV[3]) + now, ARGV[2]) == 1 then
  redis.call('rpush', KEYS[2], ARGV[2])
end
return ttl
"#
);

/// The fair lock's `unlockInnerAsync`, without its request latch: KEYS lock, queue,
/// deadlines, channel; ARGV message, lease, field, now. 1 released (or the lock was
/// gone), 0 holds left, nil not held.
pub const FAIR_UNLOCK: &str = concat!(
    fair_purge!(),
    r#"
purge(tonumber(ARGV[4]))
if redis.call('exists', KEYS[1]) == 0 then
  local head = redis.call('lindex', KEYS[2], 0)
  if head ~= false then redis.call('publish', KEYS[4] .. ':' .. head, ARGV[1]) end
  return 1
end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
if redis.call('hincrby', KEYS[1], ARGV[3], -1) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('del', KEYS[1])
local head = redis.call('lindex', KEYS[2], 0)
if head ~= false then redis.call('publish', KEYS[4] .. ':' .. head, ARGV[1]) end
return 1
"#
);

/// Every text above by the name `Texts` knows it by.
pub const ALL: &[(&str, &str)] = &[
    ("redisson:sem_acquire", SEM_ACQUIRE),
    ("redisson:sem_release", SEM_RELEASE),
    ("redisson:permit_acquire", PERMIT_ACQUIRE),
    ("redisson:permit_release", PERMIT_RELEASE),
    ("redisson:latch_count_down", LATCH_COUNT_DOWN),
    ("redisson:read_acquire", READ_ACQUIRE),
    ("redisson:read_unlock", READ_UNLOCK),
    ("redisson:write_acquire", WRITE_ACQUIRE),
    ("redisson:write_unlock", WRITE_UNLOCK),
    ("redisson:fair_acquire", FAIR_ACQUIRE),
    ("redisson:fair_unlock", FAIR_UNLOCK),
];
