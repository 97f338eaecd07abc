//! Issue 24's finding 5 for the other kinds: a hold of the caller's own field that nobody
//! took (an unlock answered too late, a hold a failover brought back). A write or fair
//! lock adopted it only on a retry: the same owner's next call counted it again, its
//! unlock answered "holds remain", and the lock stayed held by nobody for the
//! leftover's lease. A read lock did the same with its read hold. And a fenced call
//! over a plain lock's leftover, with no token counter, failed with an untyped error.
//!
//! Run: `cargo test --test adopt_kinds -- --nocapture`

mod common;

use common::RedisServer;
use redis::AsyncCommands;
use redis_rlock::{Client, OwnerId};

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

fn field(client: &Client) -> String {
    format!("{}:{}", client.id(), OwnerId::current())
}

/// A write hold nobody took: the same owner's `write().lock()` adopts it (count 1), and
/// its unlock frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_over_a_write_grant_nobody_took_is_released_by_its_unlock() {
    let (_s, client, mut con) = setup().await;
    let name = "leftover:write";
    OwnerId::scope(async {
        let f = format!("{}:write", field(&client));
        let _: () = con.hset(name, "mode", "write").await.unwrap();
        let _: () = con.hset(name, &f, 1).await.unwrap();
        let _: () = con.pexpire(name, 30_000).await.unwrap();
        let guard = client.read_write_lock(name).write().lock().await.unwrap();
        let count: i64 = con.hget(name, &f).await.unwrap();
        guard.unlock().await.unwrap();
        let exists: bool = con.exists(name).await.unwrap();
        assert!(
            count == 1 && !exists,
            "the leftover write grant counted {count}; the lock left after the unlock: {exists}"
        );
    })
    .await;
}

/// The same for a fair lock (its own acquire script).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_over_a_grant_nobody_took_is_released_by_its_unlock() {
    let (_s, client, mut con) = setup().await;
    let name = "leftover:fair";
    OwnerId::scope(async {
        let f = field(&client);
        let _: () = con.hset(name, &f, 1).await.unwrap();
        let _: () = con.pexpire(name, 30_000).await.unwrap();
        let guard = client.fair_lock(name).lock().await.unwrap();
        let count: i64 = con.hget(name, &f).await.unwrap();
        guard.unlock().await.unwrap();
        let exists: bool = con.exists(name).await.unwrap();
        assert!(
            count == 1 && !exists,
            "the leftover fair grant counted {count}; the lock left after the unlock: {exists}"
        );
    })
    .await;
}

/// A read hold nobody took, with its timeout key: the same owner's `read().lock()`
/// adopts it (count 1, the timeout key kept and raised), and after its unlock a writer
/// gets in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_lock_over_a_read_grant_nobody_took_is_released_by_its_unlock() {
    let (_s, client, mut con) = setup().await;
    let name = "leftover:read";
    OwnerId::scope(async {
        let f = field(&client);
        let timeout = format!("{{{name}}}:{f}:rwlock_timeout:1");
        let _: () = con.hset(name, "mode", "read").await.unwrap();
        let _: () = con.hset(name, &f, 1).await.unwrap();
        let _: () = con.pexpire(name, 30_000).await.unwrap();
        let _: () = con.set_ex(&timeout, 1, 30).await.unwrap();
        let guard = client.read_write_lock(name).read().lock().await.unwrap();
        let count: i64 = con.hget(name, &f).await.unwrap();
        guard.unlock().await.unwrap();
        let exists: bool = con.exists(name).await.unwrap();
        let writer = OwnerId::scope(async {
            client
                .read_write_lock(name)
                .write()
                .try_lock()
                .await
                .unwrap()
        })
        .await;
        assert!(
            count == 1 && !exists && writer.is_some(),
            "the leftover read grant counted {count}; the lock left after the unlock: \
             {exists}; a writer got in: {}",
            writer.is_some()
        );
    })
    .await;
}

/// A plain lock's leftover met by a fenced call of the same name (Redisson lets an RLock
/// and an RFencedLock share one), with no token counter yet: the adopting call draws a
/// token (1, the counter made anew) instead of failing with an untyped error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_call_over_a_plain_leftover_without_a_counter_draws_a_token() {
    let (_s, client, mut con) = setup().await;
    let name = "leftover:plain-then-fenced";
    OwnerId::scope(async {
        let f = field(&client);
        let _: () = con.hset(name, &f, 1).await.unwrap();
        let _: () = con.pexpire(name, 30_000).await.unwrap();
        let got = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            client.fenced_lock(name).lock(),
        )
        .await
        .expect("the fenced lock hangs");
        let guard = got.unwrap_or_else(|e| panic!("the adopting fenced call failed: {e:?}"));
        let token = guard.fencing_token();
        guard.unlock().await.unwrap();
        assert_eq!(token, Some(1));
        let exists: bool = con.exists(name).await.unwrap();
        assert!(!exists, "the unlock left the lock held");
    })
    .await;
}
