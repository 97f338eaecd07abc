//! A Redisson 4.7 fair-lock peer (`RedissonFairLock`): its acquire, unlock and
//! acquire-failed scripts, typed here from what they do (`shared/notes/redisson-facts.md`
//! 4.1, checked against `RedissonFairLock.java` at 66863978), and its `lock()` wait loop.
//! Like Redisson, it passes its own clock as `now`.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_rlock::protocol::{channel_name, queue_key, timeout_key};

/// Drops heads of the queue whose deadline is at or before `now` (a head without a
/// deadline stops the loop). KEYS[2] queue, KEYS[3] deadlines.
const PURGE: &str = r#"
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
"#;

/// `tryLockInnerAsync` (`EVAL_LONG`): KEYS lock, queue, deadlines; ARGV lease, field,
/// wait, now. nil when taken; else the PTTL (already queued) or the time until the
/// waiter before it is due (joining).
const ACQUIRE: &str = r#"
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
"#;

/// `unlockInnerAsync`, without its request latch: KEYS lock, queue, deadlines, channel;
/// ARGV message, lease, field, now. 1 released (or the lock was gone), 0 holds left, nil
/// not held.
const UNLOCK: &str = r#"
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
"#;

/// The lease the peer takes: Redisson's watchdog default, longer than any test holds.
pub const LEASE_MS: i64 = 30_000;

/// One Redisson thread on one fair lock, with the client's `fairLockWaitTimeout`.
#[derive(Clone)]
pub struct FairPeer {
    url: String,
    name: String,
    pub field: String,
    wait_ms: i64,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

impl FairPeer {
    /// Thread `thread` of a Redisson client with the given wait timeout.
    pub fn new(url: &str, name: &str, thread: u32, wait: Duration) -> FairPeer {
        FairPeer {
            url: url.to_string(),
            name: name.to_string(),
            field: format!("11111111-2222-4333-8444-555555555555:{thread}"),
            wait_ms: wait.as_millis() as i64,
        }
    }

    fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url.as_str())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// Runs a script with the lock's three keys (and its channel, if `channel`).
    fn run(&self, body: &str, channel: bool, args: &[String]) -> Option<i64> {
        let script = redis::Script::new(&format!("{PURGE}{body}"));
        let mut call = script.prepare_invoke();
        call.key(&self.name)
            .key(queue_key(&self.name))
            .key(timeout_key(&self.name));
        if channel {
            call.key(channel_name(&self.name));
        }
        for a in args {
            call.arg(a);
        }
        call.invoke(&mut self.conn()).unwrap()
    }

    /// One attempt: `None` when it holds the lock now, else the wait it was told.
    pub fn try_acquire(&self) -> Option<i64> {
        let args = [
            LEASE_MS.to_string(),
            self.field.clone(),
            self.wait_ms.to_string(),
            now_ms().to_string(),
        ];
        self.run(ACQUIRE, false, &args)
    }

    /// Releases one hold and tells the waiter first in line.
    pub fn unlock(&self) -> Option<i64> {
        let args = [
            "0".into(),
            LEASE_MS.to_string(),
            self.field.clone(),
            now_ms().to_string(),
        ];
        self.run(UNLOCK, true, &args)
    }

    /// Redisson's `lock()`: one attempt; if busy, subscribe to this thread's channel and
    /// try again after each message or once the wait it was told passes. `None` when
    /// `limit` passed first (Redisson would wait on).
    pub fn lock(&self, limit: Duration) -> Option<Instant> {
        let start = Instant::now();
        if self.try_acquire().is_none() {
            return Some(Instant::now());
        }
        let mut conn = self.conn();
        let mut sub = conn.as_pubsub();
        sub.subscribe(format!("{}:{}", channel_name(&self.name), self.field))
            .unwrap();
        while start.elapsed() < limit {
            let Some(wait) = self.try_acquire() else {
                return Some(Instant::now());
            };
            // A zero wait is tried again at once by Redisson; a millisecond here keeps
            // the loop from pinning a core.
            let wait = Duration::from_millis(wait.max(1) as u64).min(limit);
            sub.set_read_timeout(Some(wait)).unwrap();
            let _ = sub.get_message();
        }
        None
    }
}
