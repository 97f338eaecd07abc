//! Adversarial review of issue 24's finding 6 fix: a hand-over delivered to a waiting
//! call whose future is not polled yet (its twin, joined in the same task, runs first).
//! The offered field stays in flight only until the unlock returns; the twin's fresh
//! call then adopts the handed hold as its own first, and the waiter takes it too: two
//! guards on a count of 1.
//!
//! Run: `cargo test --test twin_handed -- --nocapture`

mod common;

use std::time::Duration;

use common::RedisServer;
use redis_rlock::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_does_not_adopt_a_hold_handed_to_its_unpolled_waiter() {
    let s = RedisServer::start();
    let a = Client::builder(s.url()).build().await.unwrap();
    let b = Client::builder(s.url()).build().await.unwrap();
    let name = "adv:twin-handover";
    let lock = a.lock(name);
    // Another owner of the same client holds the lock, in a task of its own.
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            held_tx.send(()).unwrap();
            go_rx.await.unwrap();
            g.unlock().await.unwrap();
            done_tx.send(()).unwrap();
        })
    };
    held_rx.await.unwrap();
    // The waiter: polled until it sleeps on the lock, then left unpolled.
    let waiter = lock.lock();
    tokio::pin!(waiter);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut waiter)
            .await
            .is_err(),
        "setup: the waiter got a held lock"
    );
    go_tx.send(()).unwrap();
    done_rx.await.unwrap();
    holder.await.unwrap();
    let field = a.lock(name).try_lock().await.unwrap().map(|twin| {
        let f = twin.holder_field().to_string();
        (twin, f)
    });
    let count = s.cmd::<Option<i64>>(&[
        "HGET",
        name,
        &format!("{}:{}", a.id(), redis_rlock::OwnerId::current()),
    ]);
    let waited = tokio::time::timeout(Duration::from_secs(5), &mut waiter)
        .await
        .expect("the waiter hangs")
        .unwrap();
    let Some((twin, _)) = field else {
        // The twin found the lock busy: no double grant. Clean up.
        waited.unlock().await.unwrap();
        return;
    };
    println!("twin and waiter both hold; the field counts {count:?}");
    // The twin gives its guard back; the waiter still holds.
    twin.unlock().await.unwrap();
    let other = b.lock(name).try_lock().await.unwrap();
    let is_lost = waited.is_lost();
    assert!(
        other.is_none(),
        "another client took the lock while the waiter's guard holds it (lost: {is_lost}; \
         the field counted {count:?} with two guards)"
    );
    waited.unlock().await.unwrap();
}
