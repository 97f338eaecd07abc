//! A Redisson `lock()` waiter played with Redisson's own scripts
//! ([`super::redisson_rlock`]) on plain connections: its acquire, its unlock, and its
//! sleep on the lock's channel after a busy answer. Kept apart from `redisson_rlock.rs`,
//! which the benches and the checker include as well.

use std::time::Instant;

use redis_rlock::protocol::{channel_name, UNLOCK_MESSAGE};

use super::redisson_rlock::{ACQUIRE, UNLOCK};

/// Runs Redisson's acquire for `field` on `conn`: `None` taken, else the holder's PTTL.
pub fn acquire(
    conn: &mut redis::Connection,
    name: &str,
    lease_ms: u64,
    field: &str,
) -> Option<i64> {
    redis::Script::new(ACQUIRE)
        .key(name)
        .arg(lease_ms)
        .arg(field)
        .invoke(conn)
        .unwrap()
}

/// Runs Redisson's unlock for `field` on `conn` with the request latch
/// `redisson_unlock_latch:{<name>}:<request>`, a 30 s lease and a 10 s latch TTL:
/// `Some(1)` released, `Some(0)` a count left, `None` not held by `field`.
pub fn unlock(conn: &mut redis::Connection, name: &str, request: &str, field: &str) -> Option<i64> {
    redis::Script::new(UNLOCK)
        .key(name)
        .key(channel_name(name))
        .key(format!("redisson_unlock_latch:{{{name}}}:{request}"))
        .arg(UNLOCK_MESSAGE)
        .arg(30_000)
        .arg(field)
        .arg("publish")
        .arg(10_000)
        .invoke(conn)
        .unwrap()
}

/// The waiter's sleep after a busy answer: reads `pubsub` (subscribed to the lock's
/// channel) until a `0` or a `1` (an unlock message: a `1` would wake every Redisson
/// waiter; other numbers are passed over) or `until`, pushing every number heard onto
/// `heard`.
pub fn sleep_until_unlock_message(
    pubsub: &mut redis::PubSub<'_>,
    until: Instant,
    heard: &mut Vec<i64>,
) {
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        if left.is_zero() {
            break;
        }
        pubsub.set_read_timeout(Some(left)).unwrap();
        let Ok(msg) = pubsub.get_message() else { break };
        let payload: i64 = msg.get_payload().unwrap();
        heard.push(payload);
        if payload == 0 || payload == 1 {
            break;
        }
    }
}

/// Runs `f` with the two connections a Redisson client has to `url`: one for commands
/// and one subscribed to `name`'s channel.
pub fn subscribed<T>(
    url: &str,
    name: &str,
    f: impl FnOnce(&mut redis::Connection, &mut redis::PubSub<'_>) -> T,
) -> T {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_connection().unwrap();
    let mut sub = client.get_connection().unwrap();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(channel_name(name)).unwrap();
    f(&mut conn, &mut pubsub)
}

/// Asserts that no `1` was heard on a lock's channel: a `1` is Redisson's
/// `READ_UNLOCK_MESSAGE`, on which every waiter of the channel wakes.
pub fn no_wake_all(heard: &[i64]) {
    assert!(
        !heard.contains(&1),
        "a 1 wakes every Redisson waiter: {heard:?}"
    );
}
