//! Adversarial review of the adopt path with twins: futures joined in one task share
//! its owner (they re-enter each other's holds), and are cancelled mid-flight at random,
//! half their guards dropped instead of unlocked, while another client polls. The other
//! client must never hold while a twin guard is alive, and nothing may be left held.
//!
//! Run: `cargo test --test twins_churn -- --nocapture`

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::Client;

async fn twins(kind: &'static str) {
    let s = RedisServer::start();
    let a = Client::builder(s.url())
        .watchdog_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let b = Client::builder(s.url()).build().await.unwrap();
    let name = format!("adv:twins:{kind}");
    let twins_inside = AtomicI64::new(0);
    let poller_inside = AtomicI64::new(0);
    let overlaps = AtomicI64::new(0);
    // Who saw an overlap: [twin saw the poller, twin saw the sibling, poller saw a twin,
    // sibling saw a twin].
    let seen: [AtomicI64; 4] = Default::default();
    let sibling_inside = AtomicI64::new(0);
    // Per acquire kind of the twin (try_lock, lock, lease): overlaps seen while one of
    // that kind was alive, and twin guards found lost at the end of their hold.
    let by_kind: [AtomicI64; 3] = Default::default();
    let alive_kind: [AtomicI64; 3] = Default::default();
    let lost: [AtomicI64; 3] = Default::default();
    let grants = AtomicI64::new(0);
    let deadline = Instant::now() + Duration::from_secs(5);
    let lock = match kind {
        "fenced" => a.fenced_lock(&name),
        _ => a.lock(&name),
    };
    let twin = |t: u64| {
        let (lock, twins_inside, poller_inside, overlaps, grants, seen, sibling_inside) = (
            &lock,
            &twins_inside,
            &poller_inside,
            &overlaps,
            &grants,
            &seen,
            &sibling_inside,
        );
        let (alive_kind, lost) = (&alive_kind, &lost);
        async move {
            for i in 0..300u64 {
                if Instant::now() > deadline {
                    break;
                }
                let cut = Duration::from_micros((i * 7919 + t * 104_729) % 3_000);
                let attempt = async {
                    match (i + t) % 3 {
                        0 => lock.try_lock().await.ok().flatten(),
                        1 => lock.lock().await.ok(),
                        _ => lock.lock_with_lease(Duration::from_millis(800)).await.ok(),
                    }
                };
                if let Ok(Some(g)) = tokio::time::timeout(cut, attempt).await {
                    let k = ((i + t) % 3) as usize;
                    grants.fetch_add(1, Ordering::SeqCst);
                    alive_kind[k].fetch_add(1, Ordering::SeqCst);
                    twins_inside.fetch_add(1, Ordering::SeqCst);
                    if poller_inside.load(Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                        seen[0].fetch_add(1, Ordering::SeqCst);
                    }
                    if sibling_inside.load(Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                        seen[1].fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_micros(500)).await;
                    if g.is_lost() {
                        lost[k].fetch_add(1, Ordering::SeqCst);
                    }
                    twins_inside.fetch_sub(1, Ordering::SeqCst);
                    alive_kind[k].fetch_sub(1, Ordering::SeqCst);
                    if i % 2 == 0 {
                        let _ = g.unlock().await;
                    }
                }
            }
        }
    };
    let poller = async {
        let other = match kind {
            "fenced" => b.fenced_lock(&name),
            _ => b.lock(&name),
        };
        let mut got = 0;
        for _ in 0..3000 {
            if Instant::now() > deadline {
                break;
            }
            if let Ok(Some(g)) = other.try_lock().await {
                got += 1;
                poller_inside.fetch_add(1, Ordering::SeqCst);
                if twins_inside.load(Ordering::SeqCst) > 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                    seen[2].fetch_add(1, Ordering::SeqCst);
                    for k in 0..3 {
                        if alive_kind[k].load(Ordering::SeqCst) > 0 {
                            by_kind[k].fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_micros(300)).await;
                poller_inside.fetch_sub(1, Ordering::SeqCst);
                let _ = g.unlock().await;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        got
    };
    let sibling = async {
        // Another owner of the same client: its unlocks hand over to the twins' waiters,
        // and the twins' cancellations leave those offers abandoned.
        redis_rlock::OwnerId::scope(async {
            let mut got = 0;
            for i in 0..2000u64 {
                if Instant::now() > deadline {
                    break;
                }
                let cut = Duration::from_micros(500 + (i * 7919) % 4_000);
                if let Ok(Ok(g)) = tokio::time::timeout(cut, lock.lock()).await {
                    got += 1;
                    sibling_inside.fetch_add(1, Ordering::SeqCst);
                    if twins_inside.load(Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                        seen[3].fetch_add(1, Ordering::SeqCst);
                        for k in 0..3 {
                            if alive_kind[k].load(Ordering::SeqCst) > 0 {
                                by_kind[k].fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_micros(300)).await;
                    sibling_inside.fetch_sub(1, Ordering::SeqCst);
                    let _ = g.unlock().await;
                }
            }
            got
        })
        .await
    };
    let joined = async { tokio::join!(twin(0), twin(1), twin(2)) };
    let (_, polled, sib) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(joined, poller, sibling)
    })
    .await
    .expect("the twins hang");
    let mut left = 1;
    for _ in 0..100 {
        left = s.cmd::<i64>(&["EXISTS", &name]);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fields = s.cmd::<Vec<String>>(&["HGETALL", &name]);
    let pttl = s.cmd::<i64>(&["PTTL", &name]);
    println!(
        "{kind}: overlaps by alive twin kind (try_lock, lock, lease) {:?}, lost twin guards {:?}",
        by_kind
            .iter()
            .map(|a| a.load(Ordering::SeqCst))
            .collect::<Vec<_>>(),
        lost.iter()
            .map(|a| a.load(Ordering::SeqCst))
            .collect::<Vec<_>>()
    );
    println!(
        "{kind}: twins {} grants, poller {polled}, sibling {sib}",
        grants.load(Ordering::SeqCst)
    );
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "{kind}: another owner held while a twin guard was alive \
         (twin saw poller, twin saw sibling, poller saw twin, sibling saw twin): {:?}",
        seen.iter()
            .map(|a| a.load(Ordering::SeqCst))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        left, 0,
        "{kind}: 2 s after the churn the lock is still held: {fields:?} (PTTL {pttl} ms)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_twins_never_overlap_another_owner_and_leave_nothing() {
    twins("plain").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_twins_never_overlap_another_owner_and_leave_nothing() {
    twins("fenced").await;
}
