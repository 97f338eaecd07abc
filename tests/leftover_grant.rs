//! Issue 24's finding 5: a grant nobody took. A hand-over whose waiter stopped waiting
//! for it (an abandoned offer), an unlock answered too late, or a hold that a failover
//! brought back leaves the hash with a hold of a field whose client knows of no hold.
//! The same task's next call found its own field and counted 2; its unlock answered
//! "holds remain", the client said `Ok`, and the lock stayed held by nobody until the
//! leftover's lease ran out. A call that knows of no hold now adopts such a hold as its
//! first, as it is (count 1; its TTL at least the call's lease).
//!
//! Run: `cargo test --test leftover_grant -- --nocapture`

mod common;

use common::RedisServer;
use redis::AsyncCommands;
use redis_rlock::{Client, OwnerId};

/// Leaves a hold of the calling owner's field on `name`, as a hand-over nobody took does,
/// with a `pttl` ms lease.
async fn leave_grant(
    con: &mut redis::aio::MultiplexedConnection,
    client: &Client,
    name: &str,
    pttl: u64,
) {
    let field = format!("{}:{}", client.id(), OwnerId::current());
    let _: () = con.hset(name, &field, 1).await.unwrap();
    let _: () = con.pexpire(name, pttl as i64).await.unwrap();
}

async fn setup() -> (RedisServer, Client, redis::aio::MultiplexedConnection) {
    let s = RedisServer::start();
    let client = Client::builder(s.url()).build().await.unwrap();
    let con = redis::Client::open(s.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    (s, client, con)
}

/// A watchdog lock over a leftover grant: its unlock frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_over_a_grant_nobody_took_is_released_by_its_unlock() {
    let (_s, client, mut con) = setup().await;
    let name = "leftover:watchdog";
    OwnerId::scope(async {
        leave_grant(&mut con, &client, name, 30_000).await;
        let guard = client.lock(name).lock().await.unwrap();
        let count: i64 = con
            .hget(name, format!("{}:{}", client.id(), OwnerId::current()))
            .await
            .unwrap();
        assert_eq!(count, 1, "the leftover grant was counted as a second hold");
        guard.unlock().await.unwrap();
    })
    .await;
    let exists: bool = con.exists(name).await.unwrap();
    assert!(
        !exists,
        "the unlock left the lock held by a grant nobody took"
    );
}

/// A fenced lock over a leftover grant: the adopting call draws a token of its own,
/// above the counter (the leftover may be a plain lock's, which drew none, and the
/// counter's 41 then an earlier holder's), and its unlock frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_lock_over_a_grant_nobody_took_is_released_by_its_unlock() {
    let (_s, client, mut con) = setup().await;
    let name = "leftover:fenced";
    OwnerId::scope(async {
        let _: () = con
            .set(redis_rlock::protocol::token_key(name), 41)
            .await
            .unwrap();
        leave_grant(&mut con, &client, name, 30_000).await;
        let guard = client.fenced_lock(name).lock().await.unwrap();
        assert_eq!(
            guard.fencing_token(),
            Some(42),
            "the adopting call did not draw a token above every token before"
        );
        guard.unlock().await.unwrap();
    })
    .await;
    let exists: bool = con.exists(name).await.unwrap();
    assert!(
        !exists,
        "the unlock left the lock held by a grant nobody took"
    );
}

/// Another owner of the same client still finds the lock busy: only the field's own
/// calls adopt it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_nobody_took_is_not_taken_by_another_owner() {
    let (_s, client, mut con) = setup().await;
    let name = "leftover:other";
    OwnerId::scope(async { leave_grant(&mut con, &client, name, 30_000).await }).await;
    let other =
        OwnerId::scope(async { client.lock(name).try_lock().await.unwrap().is_some() }).await;
    assert!(!other, "another owner took a hold that was not its own");
}
