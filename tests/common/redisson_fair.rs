//! A Redisson 4.7 fair-lock peer (`RedissonFairLock`): its acquire and unlock scripts
//! (typed in `tests/mc/family/peer.rs`) and its `lock()` wait loop.
//! Like Redisson, it passes its own clock as `now`.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_rlock::protocol::{channel_name, queue_key, timeout_key};

use super::peer;

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
        let script = redis::Script::new(body);
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
        self.run(peer::FAIR_ACQUIRE, false, &args)
    }

    /// Releases one hold and tells the waiter first in line.
    pub fn unlock(&self) -> Option<i64> {
        let args = [
            "0".into(),
            LEASE_MS.to_string(),
            self.field.clone(),
            now_ms().to_string(),
        ];
        self.run(peer::FAIR_UNLOCK, true, &args)
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
