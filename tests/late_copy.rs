//! Issue 24's finding 7: a late release by field. An unlock whose first send is stuck in
//! a connection the client gives up (its bytes held back, then delivered once a
//! partition heals) is retried on a new connection and answered; the same task then
//! takes the lock again. The stuck copy, delivered now, used to release that newer hold:
//! a send found no record of its request having run already. Every send of an unlock now
//! reads its latch first, and a retry leaves its outcome there (`docs/protocol.md` 2.2).
//!
//! Run: `cargo test --test late_copy -- --nocapture`

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{client_with, RedisServer};
use redis_rlock::OwnerId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_an_answered_unlock_leaves_the_next_hold() {
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let client = client_with(
        &proxy.url(),
        Duration::from_secs(30),
        Duration::from_millis(300),
    )
    .await;
    let name = "late:copy";
    OwnerId::scope(async {
        let lease = Duration::from_secs(20);
        let first = client.lock(name).lock_with_lease(lease).await.unwrap();
        let field = first.holder_field().to_string();
        proxy.stall();
        let unlock = tokio::spawn(first.unlock());
        // The first send is held back by the proxy; then its connection ends for the
        // client, which sends the unlock again on a new one.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            s.cmd::<i64>(&["HGET", name, &field]),
            1,
            "setup: the first send got through"
        );
        proxy.close_stalled_clients();
        let released = tokio::time::timeout(Duration::from_secs(10), unlock)
            .await
            .expect("the unlock hangs")
            .unwrap();
        assert!(released.is_ok(), "the retried unlock failed: {released:?}");
        assert_eq!(
            s.cmd::<i64>(&["EXISTS", name]),
            0,
            "setup: the retry released the lock"
        );
        let second = client.lock(name).lock_with_lease(lease).await.unwrap();
        assert_eq!(second.holder_field(), field, "setup: one owner");
        // The stuck first send reaches Redis now, after the retry and the new hold.
        proxy.deliver_stalled();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            s.cmd::<Option<i64>>(&["HGET", name, &field]),
            Some(1),
            "a late copy of the answered unlock released the newer hold"
        );
        second.unlock().await.unwrap();
        assert_eq!(s.cmd::<i64>(&["EXISTS", name]), 0);
    })
    .await;
}

/// No send of the unlock is answered (all held back), so the client cannot know it
/// ran. The same task's next `lock()`, on a new connection, first sends the unlock
/// again as a retry; the held-back copies, delivered after the new hold was taken, find
/// its outcome and release nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_copies_of_an_unanswered_unlock_leave_the_next_hold() {
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let client = client_with(
        &proxy.url(),
        Duration::from_secs(30),
        Duration::from_millis(200),
    )
    .await;
    let name = "late:unanswered";
    // Redis knows the unlock script already (as it does in a running service): the
    // copies delivered late are not refused for an unknown script.
    client
        .lock("late:warm")
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    OwnerId::scope(async {
        let lease = Duration::from_secs(20);
        let first = client.lock(name).lock_with_lease(lease).await.unwrap();
        let field = first.holder_field().to_string();
        proxy.stall();
        let failed = tokio::time::timeout(Duration::from_secs(10), first.unlock())
            .await
            .expect("the unlock hangs");
        let err = failed.expect_err("setup: every send was held back");
        // The error names the call, not only "a command".
        assert!(err.to_string().contains("unlock"), "{err}");
        assert_eq!(
            s.cmd::<i64>(&["HGET", name, &field]),
            1,
            "setup: nothing got through"
        );
        proxy.close_stalled_clients();
        let second = tokio::time::timeout(
            Duration::from_secs(10),
            client.lock(name).lock_with_lease(lease),
        )
        .await
        .expect("the next lock hangs")
        .unwrap();
        assert_eq!(second.holder_field(), field, "setup: one owner");
        proxy.deliver_stalled();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            s.cmd::<Option<i64>>(&["HGET", name, &field]),
            Some(1),
            "a late copy of the unanswered unlock released the newer hold"
        );
        second.unlock().await.unwrap();
        assert_eq!(s.cmd::<i64>(&["EXISTS", name]), 0);
    })
    .await;
}
