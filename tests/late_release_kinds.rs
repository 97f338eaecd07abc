//! Issue 24's finding 7 for the other kinds: a late copy of an answered unlock released
//! the same task's newer hold of a write, read or fair lock, whose unlock scripts read
//! their latch only on a retry (`unlock.lua` was fixed first). Same steps as
//! `late_copy::a_late_copy_of_an_answered_unlock_leaves_the_next_hold`, per kind.
//!
//! Run: `cargo test --test late_release_kinds -- --nocapture`

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{client_with, RedisServer};
use redis_rlock::{Client, Lock, OwnerId};

async fn late_copy_of_an_answered_unlock(kind: &str, make: fn(&Client, &str) -> Lock) {
    late_copy_with_rival(kind, make, make).await
}

/// `rival`: the lock another owner tries, which the newer hold must keep out.
async fn late_copy_with_rival(
    kind: &str,
    make: fn(&Client, &str) -> Lock,
    rival: fn(&Client, &str) -> Lock,
) {
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let client = client_with(
        &proxy.url(),
        Duration::from_secs(30),
        Duration::from_millis(300),
    )
    .await;
    let name = format!("late:{kind}");
    // Redis knows the scripts already, so late copies are not refused as NOSCRIPT.
    let warm = format!("warm:{kind}");
    make(&client, &warm)
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    OwnerId::scope(async {
        let lease = Duration::from_secs(20);
        let first = make(&client, &name).lock_with_lease(lease).await.unwrap();
        let field = first.holder_field().to_string();
        proxy.stall();
        let unlock = tokio::spawn(first.unlock());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            s.cmd::<i64>(&["HGET", &name, &field]),
            1,
            "setup: the first send got through"
        );
        proxy.close_stalled_clients();
        let released = tokio::time::timeout(Duration::from_secs(10), unlock)
            .await
            .expect("the unlock hangs")
            .unwrap();
        assert!(released.is_ok(), "the retried unlock failed: {released:?}");
        assert_eq!(s.cmd::<i64>(&["EXISTS", &name]), 0, "setup: released");
        let second = make(&client, &name).lock_with_lease(lease).await.unwrap();
        assert_eq!(second.holder_field(), field, "setup: one owner");
        proxy.deliver_stalled();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let left = s.cmd::<Option<i64>>(&["HGET", &name, &field]);
        let other = OwnerId::scope(async { rival(&client, &name).try_lock().await.unwrap() }).await;
        assert!(
            left == Some(1) && other.is_none(),
            "{kind}: a late copy of the answered unlock released the newer hold (field \
             counts {left:?}); another owner took the lock ({})",
            other.is_some()
        );
        second.unlock().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_lock_a_late_copy_of_an_answered_unlock_leaves_the_next_hold() {
    late_copy_of_an_answered_unlock("write", |c, n| c.read_write_lock(n).write()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_a_late_copy_of_an_answered_unlock_leaves_the_next_hold() {
    late_copy_of_an_answered_unlock("fair", |c, n| c.fair_lock(n)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_lock_a_late_copy_of_an_answered_unlock_leaves_the_next_hold() {
    late_copy_with_rival(
        "read",
        |c, n| c.read_write_lock(n).read(),
        |c, n| c.read_write_lock(n).write(),
    )
    .await;
}
