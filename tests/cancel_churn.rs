//! Adversarial review: acquires dropped mid-flight, over and over, by one owner, while
//! it also keeps the guards it does get for a moment. Afterwards nothing may be left
//! held, and no two owners may hold at once.
//!
//! Run: `cargo test --test cancel_churn -- --nocapture`

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::{Client, OwnerId};

async fn churn(kind: &'static str) {
    let s = RedisServer::start();
    let client = Client::builder(s.url())
        .watchdog_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let name = format!("adv:churn:{kind}");
    let inside = Arc::new(AtomicI64::new(0));
    let both = Arc::new(AtomicI64::new(0));
    let grants = Arc::new(AtomicI64::new(0));
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut tasks = Vec::new();
    for t in 0..3u64 {
        let (client, name, inside, both) =
            (client.clone(), name.clone(), inside.clone(), both.clone());
        let grants = grants.clone();
        tasks.push(tokio::spawn(async move {
            let lock = match kind {
                "fenced" => client.fenced_lock(&name),
                "fair" => client.fair_lock(&name),
                _ => client.lock(&name),
            };
            for i in 0..300u64 {
                if Instant::now() > deadline {
                    break;
                }
                // Cancelled after 0-2 ms: mid-flight, or while waiting.
                let cut = Duration::from_micros((i * 7919 + t * 104_729) % 2_000);
                let got = OwnerId::scope(async {
                    let attempt = async {
                        match (i + t) % 3 {
                            0 => lock.try_lock().await.ok().flatten(),
                            1 => lock.lock().await.ok(),
                            _ => lock.lock_with_lease(Duration::from_millis(800)).await.ok(),
                        }
                    };
                    match tokio::time::timeout(cut, attempt).await {
                        Ok(Some(g)) => {
                            grants.fetch_add(1, Ordering::SeqCst);
                            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                                both.fetch_add(1, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_micros(300)).await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                            // Every other guard is dropped, not unlocked.
                            if i % 2 == 0 {
                                let _ = g.unlock().await;
                            }
                            true
                        }
                        _ => false,
                    }
                })
                .await;
                let _ = got;
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("a churn task hangs")
            .unwrap();
    }
    // Background undos and releases finish within a few round trips.
    let mut left = 1;
    for _ in 0..100 {
        left = s.cmd::<i64>(&["EXISTS", &name]);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fields = s.cmd::<Vec<String>>(&["HKEYS", &name]);
    let pttl = s.cmd::<i64>(&["PTTL", &name]);
    let grants = grants.load(Ordering::SeqCst);
    println!("{kind}: {grants} grants");
    assert!(grants > 0, "{kind}: setup: no grant at all");
    assert_eq!(
        both.load(Ordering::SeqCst),
        0,
        "{kind}: two owners inside at once"
    );
    assert_eq!(
        left, 0,
        "{kind}: 2 s after the churn the lock is still held by {fields:?} (PTTL {pttl} ms)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_churn_leaves_nothing_held() {
    churn("plain").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_churn_leaves_nothing_held() {
    churn("fenced").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_churn_leaves_nothing_held() {
    churn("fair").await;
}
