//! The hold-back after a run of hand-overs that ended "whoever waits" (`policy::run`).
//! Found by an adversarial review: nothing capped it, so after holds longer than the
//! 80 ms cap the lock sat free for 1/32 of a hold while the client's waiters and new
//! calls slept, though nobody else wanted it, and a `try_lock_for` shorter than that
//! timed out unasked. The gap is at most 5 ms now, and a call whose wait is shorter
//! than the hold-back asks at once.
//!
//! Run: `cargo test --test run_gap -- --nocapture`

mod common;

use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::Client;

/// How long each of the first two holders keeps the lock. The gap after the second
/// release is about `HOLD / 32` (100 ms here).
const HOLD: Duration = Duration::from_millis(3200);

/// Task A holds, B and C wait; A's release hands over to B (a run of 1), and B's
/// release, past the run's 80 ms cap, ends it "whoever waits" with a gap of about
/// HOLD/32 = 100 ms. Returns the client, the lock name, and the instant at which B's
/// unlock returned, with C's acquisition still pending (its handle).
async fn run_of_two(
    s: &RedisServer,
    name: &'static str,
) -> (
    Client,
    Instant,
    tokio::task::JoinHandle<(Instant, redis_rlock::LockGuard)>,
) {
    let client = Client::builder(s.url()).build().await.unwrap();
    let a = client.lock(name).lock().await.unwrap();
    let b = {
        let client = client.clone();
        tokio::spawn(async move {
            let g = client.lock(name).lock().await.unwrap();
            let got = Instant::now();
            tokio::time::sleep(HOLD).await;
            g.unlock().await.unwrap();
            (got, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let c = {
        let client = client.clone();
        tokio::spawn(async move {
            let g = client.lock(name).lock().await.unwrap();
            (Instant::now(), g)
        })
    };
    tokio::time::sleep(HOLD).await;
    let a_released = Instant::now();
    a.unlock().await.unwrap();
    let (b_got, b_released) = b.await.unwrap();
    let handovers = client.stats().handovers;
    println!("hand-overs so far: {handovers}");
    assert_eq!(
        handovers, 1,
        "setup: A's release handed the lock to B (a run of one), B's was published"
    );
    println!(
        "B got the lock {:?} after A's release (hand-over); B released after {:?}",
        b_got.saturating_duration_since(a_released),
        b_released.saturating_duration_since(b_got)
    );
    (client, b_released, c)
}

/// A waiter woken by a published release, with nobody else anywhere wanting the lock,
/// should take it within a round trip or two (the pre-a5b2cf2 hold-back was capped at
/// 20 ms). It sleeps ~HOLD/32 instead: 100 ms with 3.2 s holds, 1 s with 32 s holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adv_woken_waiter_holds_back_a_share_of_a_long_hold() {
    let s = RedisServer::start();
    let (_client, b_released, c) = run_of_two(&s, "adv:gap:woken").await;
    let (c_got, _g) = tokio::time::timeout(Duration::from_secs(10), c)
        .await
        .expect("C got the lock")
        .unwrap();
    let latency = c_got.saturating_duration_since(b_released);
    println!("C (woken, the only one wanting the lock) got it {latency:?} after B's release");
    assert!(
        latency < Duration::from_millis(40),
        "the only waiter left took {latency:?} to take a free lock (hold-back of HOLD/32 = {:?})",
        HOLD / 32
    );
}

/// A new `try_lock_for(50 ms)` of the same client on a lock that is free (and that
/// nobody takes during those 50 ms) fails: the hold-back in `acquire_as` sleeps until
/// the deadline, and the attempt after it is cut off by `timeout_at` of a deadline
/// already passed, which `acquire_as` reports as `Error::Timeout { op: "try_lock_for:
/// its wait ended first" }` ("Redis gave no answer at all"), on a healthy local Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adv_try_lock_for_fails_on_a_free_lock_after_a_long_run() {
    let s = RedisServer::start();
    let name = "adv:gap:try";
    let (client, _b_released, c) = run_of_two(&s, name).await;
    // C is not needed past B's release (it only made B's release end the run with a
    // waiter asleep): cancelled, so that nobody but the new call wants the lock.
    c.abort();
    let _ = c.await;
    let fields: Vec<String> = s.cmd(&["HGETALL", name]);
    println!("after B's release and C's cancellation: lock hash {fields:?}");
    let started = Instant::now();
    let got = client
        .lock(name)
        .try_lock_for(Duration::from_millis(50), None)
        .await;
    let took = started.elapsed();
    let outcome = match &got {
        Ok(Some(_)) => "Ok(Some)".to_string(),
        Ok(None) => "Ok(None)".to_string(),
        Err(e) => format!("Err({e:?})"),
    };
    println!("try_lock_for(50ms) on a free lock -> {outcome} after {took:?}");
    let ok = matches!(got, Ok(Some(_)));
    drop(got);
    let held_after: i64 = s.cmd(&["EXISTS", name]);
    println!("lock key exists after the try: {held_after}");
    assert!(
        ok,
        "try_lock_for(50 ms) on a lock nobody held or took: {outcome} after {took:?}"
    );
}
