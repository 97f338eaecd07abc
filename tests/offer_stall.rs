//! A waiter offered the lock by its client's unlock, whose future is then left
//! unpolled: it waits for that unlock at most the offer bound, then acquires on its
//! own (`docs/protocol.md` 2.2). Found by an adversarial review: the mark that keeps
//! an offered field in flight until the offer settles (finding 6) made its own acquire
//! wait a second offer bound (5.2 s instead of 3.0 s here). An adopting attempt no
//! longer waits for that mark.
//!
//! Run: `cargo test --test offer_stall -- --nocapture`

mod common;

use std::future::Future;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use common::{client_with, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv_offered_waiter_of_an_unpolled_unlock_waits_one_offer_bound() {
    let s = RedisServer::start();
    // As `handover::a_waiter_stops_waiting_on_an_unlock_left_unpolled`: a 1 s lease
    // bounds the waiter's sleep (an offer does not wake it; it sees the offer when it
    // wakes), and offer_bound = (200 + 500) x 3 + 100 ms = 2.2 s.
    let client = client_with(&s.url(), Duration::from_secs(1), Duration::from_millis(200)).await;
    let bound = Duration::from_millis(2200);
    let lease = Duration::from_secs(1);
    // A run where the reply comes back before the hash is read shows nothing: try again.
    for round in 0..8 {
        let name = format!("adv:offer:unpolled:{round}");
        if let Some(waited) = offered_waiter_waits(&s, &client, &name).await {
            println!("offer_bound {bound:?}; the offered waiter got the lock after {waited:?}");
            assert!(
                waited < lease + bound + Duration::from_millis(800),
                "the offered waiter of an unpolled unlock waited {waited:?}; expected its sleep ({lease:?}) and one offer_bound ({bound:?})"
            );
            return;
        }
    }
    panic!("setup: the unlock always finished at once");
}

/// How long the waiter offered the lock by an unlock that is then left unpolled waits;
/// `None` if the unlock finished before it could be left.
async fn offered_waiter_waits(
    s: &RedisServer,
    client: &redis_rlock::Client,
    name: &str,
) -> Option<Duration> {
    let held = client.lock(name).lock().await.unwrap();
    let waiter = tokio::spawn({
        let l = client.lock(name);
        async move {
            let g = l.lock().await.unwrap();
            let at = Instant::now();
            g.unlock().await.unwrap();
            at
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The unlock is polled once (the request goes out, with the offer to the waiter)
    // and then kept alive without being polled again.
    let mut unlock = Box::pin(held.unlock());
    let started = Instant::now();
    let mut cx = Context::from_waker(Waker::noop());
    let before: Vec<String> = s.cmd(&["HGETALL", name]);
    // Polled (with a waker that wakes nobody) until Redis ran it: the hand-over wrote
    // the waiter's field. Then never again: the reply is not taken up.
    let mut handed = false;
    for _ in 0..2000 {
        if unlock.as_mut().poll(&mut cx).is_ready() {
            waiter.await.unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_micros(200));
        let fields: Vec<String> = s.cmd(&["HGETALL", name]);
        if !fields.is_empty() && fields[0] != before[0] {
            println!(
                "after {:?}: lock hash {fields:?} (was {before:?})",
                started.elapsed()
            );
            handed = true;
            break;
        }
    }
    assert!(handed, "setup: the unlock ran in Redis and handed over");
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter got the lock within 10 s")
        .unwrap();
    drop(unlock);
    Some(got.saturating_duration_since(started))
}
