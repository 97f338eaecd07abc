//! Adversarial review of issue 24's finding 7 fix: an unanswered release is recorded
//! and sent again before the field's next acquire. These tests attack the record's
//! life: an acquire cancelled (by its caller, or by `try_lock`'s own bound) while it
//! resends the record, and a release of the same field that comes before any acquire.
//!
//! Run: `cargo test --test unanswered -- --nocapture`

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{client_with, RedisServer};
use redis_rlock::OwnerId;

/// Makes the first unlock of `first` fail with every send held back by the proxy, on a
/// connection that stays stalled.
async fn unanswered_unlock(s: &RedisServer, proxy: &Proxy, first: redis_rlock::LockGuard) {
    let name = first.name().to_string();
    let field = first.holder_field().to_string();
    proxy.stall();
    let failed = tokio::time::timeout(Duration::from_secs(10), first.unlock())
        .await
        .expect("the unlock hangs");
    assert!(
        failed.is_err(),
        "setup: every send was held back, yet: {failed:?}"
    );
    assert_eq!(
        s.cmd::<i64>(&["HGET", &name, &field]),
        1,
        "setup: nothing got through"
    );
}

async fn warm(client: &redis_rlock::Client) {
    // Redis knows the scripts already, so late copies are not refused as NOSCRIPT.
    let g = client.lock("adv:warm").lock().await.unwrap();
    g.unlock().await.unwrap();
}

/// The caller of the next `lock()` gives up on it (a `timeout` around it, which the docs
/// call cancel safe) while it is resending the unanswered release. The record is gone;
/// the following `lock()` adopts the old hold, and the held-back copies of the old
/// unlock, delivered late, release the new guard's hold: the guard believes it holds a
/// lock that is free, and another owner takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_resend_of_an_unanswered_unlock_lets_a_late_copy_free_the_next_hold() {
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let client = client_with(
        &proxy.url(),
        Duration::from_secs(30),
        Duration::from_millis(200),
    )
    .await;
    warm(&client).await;
    let name = "adv:cancelled-resend";
    let lease = Duration::from_secs(20);
    OwnerId::scope(async {
        let first = client.lock(name).lock_with_lease(lease).await.unwrap();
        let field = first.holder_field().to_string();
        unanswered_unlock(&s, &proxy, first).await;
        // The resend goes out on the stalled connection; the caller gives up first.
        let gave_up = tokio::time::timeout(
            Duration::from_millis(50),
            client.lock(name).lock_with_lease(lease),
        )
        .await;
        assert!(
            gave_up.is_err(),
            "setup: the resend was answered: {gave_up:?}"
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
        let other = OwnerId::scope(async { client.lock(name).try_lock().await.unwrap() }).await;
        assert!(
            s.cmd::<Option<i64>>(&["HGET", name, &field]) == Some(1) && other.is_none(),
            "a late copy of the unanswered unlock released the newer hold: \
             another owner took the lock ({}) while the second guard believes it holds it",
            other.is_some()
        );
        second.unlock().await.unwrap();
    })
    .await;
}

/// As above, but nobody cancels anything: `try_lock` bounds its attempt by one response
/// timeout, and the resend of the record (up to three sends) runs inside that bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_drops_the_unanswered_record_and_a_late_copy_frees_the_next_hold() {
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let client = client_with(
        &proxy.url(),
        Duration::from_secs(30),
        Duration::from_millis(200),
    )
    .await;
    warm(&client).await;
    let name = "adv:try-lock-resend";
    let lease = Duration::from_secs(20);
    OwnerId::scope(async {
        let first = client.lock(name).lock_with_lease(lease).await.unwrap();
        let field = first.holder_field().to_string();
        unanswered_unlock(&s, &proxy, first).await;
        let tried = tokio::time::timeout(Duration::from_secs(5), client.lock(name).try_lock())
            .await
            .expect("try_lock hangs");
        assert!(tried.is_err(), "setup: the resend was answered: {tried:?}");
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
        let other = OwnerId::scope(async { client.lock(name).try_lock().await.unwrap() }).await;
        assert!(
            s.cmd::<Option<i64>>(&["HGET", name, &field]) == Some(1) && other.is_none(),
            "a late copy of the unanswered unlock released the newer hold: \
             another owner took the lock ({}) while the second guard believes it holds it",
            other.is_some()
        );
        second.unlock().await.unwrap();
    })
    .await;
}

/// Two fixed-lease holds of one owner (count 2). The inner guard's unlock gets no answer
/// (recorded as unanswered); the outer guard's unlock is answered, releases one hold and
/// reports `Ok`. The record is only resent before the field's next acquire, not before
/// its next release: the lock stays held by nobody for the rest of its lease when the
/// held-back copy never arrives (a dead connection's buffer is lost as often as it is
/// delivered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_an_unanswered_release_leaves_the_lock_held_by_nobody() {
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let client = client_with(
        &proxy.url(),
        Duration::from_secs(30),
        Duration::from_millis(200),
    )
    .await;
    warm(&client).await;
    let name = "adv:release-after-unanswered";
    let lease = Duration::from_secs(20);
    OwnerId::scope(async {
        let outer = client.lock(name).lock_with_lease(lease).await.unwrap();
        let inner = client.lock(name).lock_with_lease(lease).await.unwrap();
        let field = outer.holder_field().to_string();
        assert_eq!(
            s.cmd::<i64>(&["HGET", name, &field]),
            2,
            "setup: re-entered"
        );
        proxy.stall();
        let failed = tokio::time::timeout(Duration::from_secs(10), inner.unlock())
            .await
            .expect("the unlock hangs");
        assert!(
            failed.is_err(),
            "setup: every send was held back, yet: {failed:?}"
        );
        // The partition heals; what the dead connection held back is lost.
        proxy.close_stalled_clients();
        let last = tokio::time::timeout(Duration::from_secs(10), outer.unlock())
            .await
            .expect("the last unlock hangs");
        assert!(last.is_ok(), "the last unlock failed: {last:?}");
        let left = s.cmd::<Option<i64>>(&["HGET", name, &field]);
        let pttl = s.cmd::<i64>(&["PTTL", name]);
        let other = OwnerId::scope(async { client.lock(name).try_lock().await.unwrap() }).await;
        assert!(
            left.is_none() && other.is_some(),
            "every guard was given back and the last unlock said Ok, yet the hash still \
             counts {left:?} for the field (PTTL {pttl} ms) and another owner cannot take it"
        );
    })
    .await;
}

/// The client shuts down with an unanswered release recorded (its guard is gone): the
/// shutdown, which promises to release every hold, does not send it again, answers Ok,
/// and the lock stays held by nobody for the rest of its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_an_unanswered_release_unsent() {
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let client = client_with(
        &proxy.url(),
        Duration::from_secs(30),
        Duration::from_millis(200),
    )
    .await;
    warm(&client).await;
    let name = "adv:shutdown-unanswered";
    let lease = Duration::from_secs(20);
    let field = OwnerId::scope(async {
        let first = client.lock(name).lock_with_lease(lease).await.unwrap();
        let field = first.holder_field().to_string();
        unanswered_unlock(&s, &proxy, first).await;
        field
    })
    .await;
    // The partition heals; what the dead connection held back is lost.
    proxy.close_stalled_clients();
    let down = tokio::time::timeout(Duration::from_secs(20), client.shutdown())
        .await
        .expect("shutdown hangs");
    let left = s.cmd::<Option<i64>>(&["HGET", name, &field]);
    let pttl = s.cmd::<i64>(&["PTTL", name]);
    assert!(
        left.is_none(),
        "shutdown answered {down:?}, yet the field still counts {left:?} (PTTL {pttl} ms)"
    );
}

/// Two unanswered releases of one field (two fixed-lease holds of one owner, both
/// unlocks held back): the table keeps one record per field, so the second overwrites
/// the first. The next `lock()` resends only the second; the first's held-back copy,
/// delivered late, releases the new guard's hold and another owner takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_unanswered_release_overwrites_the_first_and_a_late_copy_frees_the_next_hold() {
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let client = client_with(
        &proxy.url(),
        Duration::from_secs(30),
        Duration::from_millis(200),
    )
    .await;
    warm(&client).await;
    let name = "adv:two-unanswered";
    let lease = Duration::from_secs(20);
    OwnerId::scope(async {
        let outer = client.lock(name).lock_with_lease(lease).await.unwrap();
        let inner = client.lock(name).lock_with_lease(lease).await.unwrap();
        let field = outer.holder_field().to_string();
        proxy.stall();
        for guard in [inner, outer] {
            let failed = tokio::time::timeout(Duration::from_secs(10), guard.unlock())
                .await
                .expect("the unlock hangs");
            assert!(
                failed.is_err(),
                "setup: every send was held back, yet: {failed:?}"
            );
        }
        assert_eq!(
            s.cmd::<i64>(&["HGET", name, &field]),
            2,
            "setup: nothing got through"
        );
        proxy.close_stalled_clients();
        let next = tokio::time::timeout(
            Duration::from_secs(10),
            client.lock(name).lock_with_lease(lease),
        )
        .await
        .expect("the next lock hangs")
        .unwrap();
        assert_eq!(next.holder_field(), field, "setup: one owner");
        proxy.deliver_stalled();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let left = s.cmd::<Option<i64>>(&["HGET", name, &field]);
        let other = OwnerId::scope(async { client.lock(name).try_lock().await.unwrap() }).await;
        assert!(
            left == Some(1) && other.is_none(),
            "a late copy of the first unanswered unlock released the newer hold (field \
             counts {left:?}): another owner took the lock ({}) while the guard believes \
             it holds it",
            other.is_some()
        );
        next.unlock().await.unwrap();
    })
    .await;
}
