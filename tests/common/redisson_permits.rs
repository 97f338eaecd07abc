//! Redisson's `RPermitExpirableSemaphore` scripts, typed in by hand from the facts and
//! run with `redis::Script`, for tests that share a semaphore with a Redisson peer.

use redis_rlock::protocol;

/// Milliseconds since the epoch on this machine's clock, as Redisson's client counts.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Redisson's `RPermitExpirableSemaphore` acquire of one permit under `id` (16 bytes),
/// with its client clock: "OK", ":<earliest expiry>" or nil.
pub fn redisson_permit_acquire(
    conn: &mut redis::Connection,
    name: &str,
    id: &[u8],
    lease_ms: u64,
) -> Option<String> {
    let script = redis::Script::new(
        r"
        local gone = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3], 'limit', 0, ARGV[1])
        if #gone > 0 then
            redis.call('zrem', KEYS[2], unpack(gone))
            local back = redis.call('incrby', KEYS[1], #gone)
            if tonumber(back) > 0 then redis.call(ARGV[5], KEYS[3], back) end
        end
        local have = redis.call('get', KEYS[1])
        if have ~= false and tonumber(have) >= tonumber(ARGV[1]) then
            redis.call('decrby', KEYS[1], ARGV[1])
            for i = 6, #ARGV do redis.call('zadd', KEYS[2], ARGV[2], ARGV[i]) end
            local ttl = redis.call('pttl', KEYS[1])
            if ttl > 0 then redis.call('pexpire', KEYS[2], ttl) end
            return 'OK'
        end
        local head = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
        if head[1] ~= nil and head[2] ~= ARGV[4] then return ':' .. tostring(head[2]) end
        return nil",
    );
    let now = now_ms();
    script
        .key(name)
        .key(protocol::permit_timeout_key(name))
        .key(protocol::semaphore_channel(name))
        .arg(1)
        .arg(now + lease_ms)
        .arg(now)
        .arg("922337203685477")
        .arg("publish")
        .arg(id)
        .invoke(conn)
        .unwrap()
}

/// Redisson's `RPermitExpirableSemaphore.tryRelease(id)`: 1 when released live.
pub fn redisson_permit_release(conn: &mut redis::Connection, name: &str, id: &[u8]) -> i64 {
    let script = redis::Script::new(
        r"
        local ends = redis.call('zscore', KEYS[3], ARGV[1])
        local removed = redis.call('zrem', KEYS[3], ARGV[1])
        if tonumber(removed) ~= 1 then return 0 end
        local now = redis.call('incrby', KEYS[1], ARGV[2])
        redis.call(ARGV[4], KEYS[2], now)
        if tonumber(ends) <= tonumber(ARGV[3]) then return 0 end
        return 1",
    );
    script
        .key(name)
        .key(protocol::semaphore_channel(name))
        .key(protocol::permit_timeout_key(name))
        .arg(id)
        .arg(1)
        .arg(now_ms())
        .arg("publish")
        .invoke(conn)
        .unwrap()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
