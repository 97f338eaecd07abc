//! A listening client marks a plain lock's channel in the sharded namespace
//! (`docs/protocol.md` 2.6), so that a release tells a subscriber of this crate from a
//! Redisson waiter; and it still listens where the server refuses the mark or RESP3.

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

fn shardnumsub(s: &RedisServer, channel: &str) -> i64 {
    let v: Vec<redis::Value> = s.cmd(&["PUBSUB", "SHARDNUMSUB", channel]);
    redis::from_redis_value(v[1].clone()).unwrap()
}

/// A waiter on `name` held for 30 s by another holder; released by that holder after
/// both counts were read while it waits. Returns (plain subscribers, marks, how long
/// after the release the waiter got the lock).
async fn wait_and_count(s: &RedisServer, client: &Client, name: &str) -> (i64, i64, Duration) {
    held_elsewhere(s, name, 30_000);
    let lock = client.lock(name);
    let waiter = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    });
    let ch = channel_name(name);
    let subscribed = common::eventually(Duration::from_secs(5), || s.numsub(&ch) == 1).await;
    assert!(subscribed, "the waiter never subscribed");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let counts = (s.numsub(&ch), shardnumsub(s, &ch));
    // The holder's release as Redisson's unlock sends it.
    let released = Instant::now();
    let _: i64 = s.cmd(&["DEL", name]);
    let _: i64 = s.cmd(&["PUBLISH", &ch, "0"]);
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the published release wakes the waiter")
        .unwrap();
    (counts.0, counts.1, got.saturating_duration_since(released))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_client_marks_the_channel_and_drops_the_mark_with_it() {
    let s = RedisServer::start();
    let name = "marks:plain";
    let client = Client::connect(s.url()).await.unwrap();
    let (plain, marks, after) = wait_and_count(&s, &client, name).await;
    assert_eq!((plain, marks), (1, 1), "one subscription, one mark");
    assert!(after < Duration::from_secs(1), "{after:?}");
    // Both go when the linger is over.
    let ch = channel_name(name);
    let gone = common::eventually(Duration::from_secs(3), || {
        s.numsub(&ch) == 0 && shardnumsub(&s, &ch) == 0
    })
    .await;
    assert!(
        gone,
        "{} plain, {} marks left",
        s.numsub(&ch),
        shardnumsub(&s, &ch)
    );
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_turns_does_not_mark() {
    let s = RedisServer::start();
    let client = Client::builder(s.url())
        .turn_window(Duration::ZERO)
        .build()
        .await
        .unwrap();
    let (plain, marks, _) = wait_and_count(&s, &client, "marks:no-turns").await;
    assert_eq!((plain, marks), (1, 0));
    client.shutdown().await.unwrap();
}

/// A server that does not know `SSUBSCRIBE` (as Redis 6) is listened to without marks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_sharded_pubsub_is_heard_without_marks() {
    let s = RedisServer::start_with(&["--rename-command", "SSUBSCRIBE", ""]);
    let client = Client::connect(s.url()).await.unwrap();
    for round in 0..2 {
        let name = format!("marks:no-ssubscribe:{round}");
        let (plain, marks, after) = wait_and_count(&s, &client, &name).await;
        assert_eq!((plain, marks), (1, 0), "round {round}");
        assert!(after < Duration::from_secs(1), "round {round}: {after:?}");
    }
    client.shutdown().await.unwrap();
}

/// A server that does not speak RESP3 (`HELLO` unknown, as before Redis 6) is listened
/// to over RESP2, without marks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_resp3_is_heard_over_resp2() {
    let s = RedisServer::start_with(&["--rename-command", "HELLO", ""]);
    let client = Client::connect(s.url()).await.unwrap();
    for round in 0..2 {
        let name = format!("marks:resp2:{round}");
        let (plain, marks, after) = wait_and_count(&s, &client, &name).await;
        assert_eq!((plain, marks), (1, 0), "round {round}");
        assert!(after < Duration::from_secs(1), "round {round}: {after:?}");
    }
    client.shutdown().await.unwrap();
}
