//! Two calls of one task at once on one name (`tokio::join!`, issue 24's finding 6),
//! with the lock held by another task of the same client. The first call is handed the
//! lock when the holder releases; the second has the same holder field and may
//! re-enter at once. Found by an adversarial review: nothing woke it (a hand-over
//! publishes nothing), and it slept until the holder's lease from its busy reply (the
//! 30 s watchdog lease). The hand-over now wakes the field's other waiters.
//!
//! Run: `cargo test --test twins -- --nocapture`

mod common;

use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::Client;

/// `holder_lease`: the lease of the other task's hold (`None`: watchdog, 30 s); the
/// second twin sleeps for what its busy reply said was left of it.
async fn twins(lease_twin: bool, holder_lease: Option<Duration>) -> Duration {
    let s = RedisServer::start();
    let client = Client::builder(s.url()).build().await.unwrap();
    let name = "adv:twins";
    let held = match holder_lease {
        Some(l) => client.lock(name).lock_with_lease(l).await.unwrap(),
        None => client.lock(name).lock().await.unwrap(),
    };
    let twins = tokio::spawn({
        let client = client.clone();
        async move {
            let (a, b) = (client.lock(name), client.lock(name));
            let started = Instant::now();
            let second = async {
                if lease_twin {
                    b.lock_with_lease(Duration::from_secs(30)).await
                } else {
                    b.lock().await
                }
            };
            let (ga, gb) = tokio::join!(a.lock(), second);
            let took = started.elapsed();
            ga.unwrap().unlock().await.unwrap();
            gb.unwrap().unlock().await.unwrap();
            took
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.unlock().await.unwrap();
    let took = match tokio::time::timeout(Duration::from_secs(5), twins).await {
        Ok(t) => t.unwrap(),
        Err(_) => {
            let fields: Vec<String> = s.cmd(&["HGETALL", name]);
            let pttl: i64 = s.cmd(&["PTTL", name]);
            panic!(
                "join! of two lock calls of one task still waiting 5 s after the other \
                 task's release; the lock is held by the first twin: {fields:?}, pttl {pttl} ms \
                 (the second twin, same field, sleeps until the bound its busy reply gave: the previous holder's lease)"
            );
        }
    };
    let stats = client.stats();
    println!(
        "twins (lease twin: {lease_twin}) both held after {took:?}; hand-overs {}",
        stats.handovers
    );
    let left: i64 = s.cmd(&["EXISTS", name]);
    assert_eq!(left, 0, "nothing left held");
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv_join_twins_both_get_the_lock_soon_after_release() {
    let took = twins(false, None).await;
    assert!(
        took < Duration::from_secs(2),
        "join!(lock, lock) of one task took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv_join_twins_with_a_lease_twin_get_the_lock_soon_after_release() {
    let took = twins(true, None).await;
    assert!(
        took < Duration::from_secs(2),
        "join!(lock, lock_with_lease) of one task took {took:?}"
    );
}

/// With a holder of a long fixed lease (10 min), the twins wait ~10 min: a self-stall
/// as long as the *previous* holder's lease, though their own task holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv_join_twins_after_a_long_lease_holder() {
    let took = twins(false, Some(Duration::from_secs(600))).await;
    assert!(took < Duration::from_secs(2), "took {took:?}");
}
