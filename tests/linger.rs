//! How long a client keeps listening on a lock's channel after its waiters left
//! (`docs/protocol.md` 1.4): for a while after a wait, so that the next wait of a
//! contended name needs no new `SUBSCRIBE`, and not for good because the name is used.

mod common;

use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::protocol::channel_name;
use redis_rlock::Client;

/// A holder of another client (Redisson's field layout) that lets go after `ms`.
fn held_elsewhere(s: &RedisServer, name: &str, ms: u64) {
    let field = "d1b0f1a4-7c2e-4b8a-9f3d-5e6a7b8c9d0e:1";
    let _: i64 = s.cmd(&["HSET", name, field, "1"]);
    let _: i64 = s.cmd(&["PEXPIRE", name, &ms.to_string()]);
}

/// One wait, then uncontended `lock()` + `unlock()` pairs for a second, each well
/// within the linger of the one before. The pairs' first attempts join the channel the
/// wait left subscribed, but none of them needs it: the channel goes 200 ms after the
/// wait, not after the last pair. Before, it stayed for as long as the pairs went on,
/// and the client heard its every release: 20,100 pairs took 4.5-4.9 s instead of
/// 3.7 s (`benches/pairs.rs`, a release build, the first lock held 300 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_used_without_waiting_stops_being_heard_after_its_linger() {
    let s = RedisServer::start();
    let name = "linger:uncontended";
    let client = Client::builder(s.url()).build().await.unwrap();
    let lock = client.lock(name);
    held_elsewhere(&s, name, 100);
    lock.lock().await.unwrap().unlock().await.unwrap();
    assert_eq!(s.numsub(&channel_name(name)), 1, "the wait subscribed");

    let start = Instant::now();
    let mut pairs = 0;
    // Bounded in count and time.
    while start.elapsed() < Duration::from_secs(1) && pairs < 100_000 {
        lock.lock().await.unwrap().unlock().await.unwrap();
        pairs += 1;
    }
    let listening = s.numsub(&channel_name(name));
    assert_eq!(
        listening,
        0,
        "still subscribed after {pairs} pairs in {:?} that never waited",
        start.elapsed()
    );
    client.shutdown().await.unwrap();
}

/// The linger itself is kept: a channel a waiter slept on stays subscribed after it
/// left, with no call since, and goes once the linger is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_a_waiter_slept_on_lingers_then_goes() {
    let s = RedisServer::start();
    let name = "linger:waited";
    let client = Client::builder(s.url()).build().await.unwrap();
    held_elsewhere(&s, name, 100);
    let lock = client.lock(name);
    lock.lock().await.unwrap().unlock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(s.numsub(&channel_name(name)), 1, "lingers after the wait");
    let gone = Instant::now() + Duration::from_secs(5);
    while s.numsub(&channel_name(name)) != 0 {
        assert!(Instant::now() < gone, "still subscribed 5 s after the wait");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.shutdown().await.unwrap();
}
