//! A new user (round 6) runs the service shapes `docs/protocol.md` 1.4's last paragraph
//! speaks of, against a real redis-server, and watches `PUBSUB NUMSUB` of the lock's
//! channel: a name contended for 200 ms, then used alone for a second, stops being heard
//! about 200 ms after the wait and not after the loop, and the next wait still hears the
//! release; two tasks of one client taking turns keep the channel (one `SUBSCRIBE`) for as
//! long as they alternate; a write lock, or a client without turns, does not linger.
//! Run: `cargo test --test newuser6 -- --nocapture`

mod common;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::protocol::channel_name;
use redis_rlock::Client;

/// Samples `PUBSUB NUMSUB channel` (or, for a pattern with `*`, the number of channels
/// `PUBSUB CHANNELS` lists) every 5 ms on a connection of its own for `span`, and returns
/// each change as (time since `origin`, count), the first sample included. A thread, so that the sampling goes on while the test's tasks run.
fn sample_numsub(
    url: String,
    channel: String,
    origin: Instant,
    span: Duration,
) -> JoinHandle<Vec<(Duration, i64)>> {
    std::thread::spawn(move || {
        let client = redis::Client::open(url).unwrap();
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut changes: Vec<(Duration, i64)> = Vec::new();
        let end = Instant::now() + span;
        while Instant::now() < end {
            let n: i64 = if channel.contains('*') {
                let names: Vec<String> = redis::cmd("PUBSUB")
                    .arg("CHANNELS")
                    .arg(&channel)
                    .query(&mut conn)
                    .unwrap();
                names.len() as i64
            } else {
                let v: Vec<redis::Value> = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(&channel)
                    .query(&mut conn)
                    .unwrap();
                redis::from_redis_value(v[1].clone()).unwrap()
            };
            if changes.last().is_none_or(|&(_, last)| last != n) {
                changes.push((origin.elapsed(), n));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        changes
    })
}

/// Another client takes `name` and gives it back after `ms`; the returned task yields
/// when the release was answered.
async fn held_by_other(other: &Client, name: &str, ms: u64) -> tokio::task::JoinHandle<Instant> {
    let g = other.lock(name).lock().await.unwrap();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        g.unlock().await.unwrap();
        Instant::now()
    })
}

/// The call asked at `asked` waited for the other client's hold (at least 150 ms of its
/// 200) and got the lock soon after its release (within 500 ms).
fn waited_then_heard(asked: Instant, got: Instant, released: Instant, what: &str) {
    assert!(
        got - asked >= Duration::from_millis(150),
        "{what} did not wait: {:?}",
        got - asked
    );
    assert!(
        got - released < Duration::from_millis(500),
        "{what} got the lock {:?} after the release",
        got - released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_moment_then_a_quiet_loop_stops_listening_after_the_linger() {
    let s = RedisServer::start();
    let name = "nu6:orders";
    let channel = channel_name(name);
    let ours = Client::connect(s.url()).await.unwrap();
    let other = Client::connect(s.url()).await.unwrap();
    let lock = ours.lock(name);
    let subscribes_before = s.calls("subscribe");

    // A moment of contention: the other client holds the name 200 ms while ours waits.
    let release = held_by_other(&other, name, 200).await;
    let asked = Instant::now();
    let g = lock.lock().await.unwrap();
    let waited_until = Instant::now();
    let released = release.await.unwrap();
    waited_then_heard(asked, waited_until, released, "the first wait");
    assert_eq!(
        s.numsub(&channel),
        1,
        "the waiting client listens on {channel}"
    );
    g.unlock().await.unwrap();

    // Then the service uses the name alone for a second, watched from the side.
    let sampler = sample_numsub(
        s.url(),
        channel.clone(),
        waited_until,
        Duration::from_millis(1300),
    );
    let mut pairs = 0u32;
    // Bounded in count and time.
    while waited_until.elapsed() < Duration::from_secs(1) && pairs < 100_000 {
        lock.lock().await.unwrap().unlock().await.unwrap();
        pairs += 1;
    }
    let loop_end = waited_until.elapsed();
    let changes = sampler.join().unwrap();
    println!("{pairs} pairs in {loop_end:?}; NUMSUB changes since the wait: {changes:?}");
    let gone = changes
        .iter()
        .find(|&&(_, n)| n == 0)
        .map(|&(t, _)| t)
        .unwrap_or_else(|| panic!("still listening after {pairs} quiet pairs: {changes:?}"));
    assert!(
        gone >= Duration::from_millis(150) && gone <= Duration::from_millis(600),
        "the docs' 200 ms linger after the wait: gone {gone:?} after it ({changes:?})"
    );
    assert!(
        gone + Duration::from_millis(300) < loop_end,
        "gone at {gone:?}, not well before the loop's end at {loop_end:?}"
    );
    assert_eq!(
        changes.last().map(|&(_, n)| n),
        Some(0),
        "heard again during the quiet loop: {changes:?}"
    );
    assert_eq!(
        s.calls("subscribe") - subscribes_before,
        1,
        "one SUBSCRIBE for the one wait"
    );

    // Contended again: the wait subscribes afresh and still hears the release.
    let release = held_by_other(&other, name, 200).await;
    let watcher = sample_numsub(
        s.url(),
        channel.clone(),
        Instant::now(),
        Duration::from_millis(150),
    );
    let asked = Instant::now();
    let g = tokio::time::timeout(Duration::from_secs(10), lock.lock())
        .await
        .expect("the second wait never got the lock in 10 s")
        .unwrap();
    let got = Instant::now();
    let released = release.await.unwrap();
    waited_then_heard(asked, got, released, "the second wait");
    let during = watcher.join().unwrap();
    assert_eq!(
        during.last().map(|&(_, n)| n),
        Some(1),
        "listening during the second wait: {during:?}"
    );
    assert_eq!(
        s.calls("subscribe") - subscribes_before,
        2,
        "a new SUBSCRIBE for the second wait"
    );
    g.unlock().await.unwrap();
    ours.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_of_one_client_taking_turns_keep_the_channel() {
    let s = RedisServer::start();
    let name = "nu6:shared";
    let channel = channel_name(name);
    let client = Client::connect(s.url()).await.unwrap();
    let subscribes_before = s.calls("subscribe");
    let origin = Instant::now();
    let sampler = sample_numsub(
        s.url(),
        channel.clone(),
        origin,
        Duration::from_millis(1700),
    );

    // Each task holds 20 ms, gives the lock back and asks again at once: the other task,
    // waiting meanwhile, takes it; for a second, at most 100 rounds each.
    let waits = Arc::new(std::sync::Mutex::new(Vec::<Duration>::new()));
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let lock = client.lock(name);
            let waits = waits.clone();
            tokio::spawn(async move {
                let mut rounds = 0;
                while origin.elapsed() < Duration::from_secs(1) && rounds < 100 {
                    let asked = Instant::now();
                    let g = tokio::time::timeout(Duration::from_secs(5), lock.lock())
                        .await
                        .expect("a turn never came in 5 s")
                        .unwrap();
                    waits.lock().unwrap().push(asked.elapsed());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    g.unlock().await.unwrap();
                    rounds += 1;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let alternation_end = origin.elapsed();
    let changes = sampler.join().unwrap();
    let waits = waits.lock().unwrap().clone();
    let waited = waits
        .iter()
        .filter(|w| **w >= Duration::from_millis(10))
        .count();
    let slowest = waits.iter().max().copied().unwrap_or_default();
    println!(
        "{} grants, {waited} after a wait, slowest {slowest:?}; alternation ended at {alternation_end:?}; NUMSUB changes: {changes:?}",
        waits.len()
    );
    assert!(
        waited >= 20,
        "the tasks did not take turns: {waited} waits of {}",
        waits.len()
    );
    assert!(
        slowest < Duration::from_millis(500),
        "a turn came late: {slowest:?}"
    );

    // Subscribed from the first wait to the end of the turns, without a gap.
    let first = changes
        .iter()
        .position(|&(_, n)| n == 1)
        .unwrap_or_else(|| panic!("never listening: {changes:?}"));
    let dropped = changes[first..]
        .iter()
        .find(|&&(t, n)| n == 0 && t < alternation_end);
    assert!(
        dropped.is_none(),
        "the channel went while the tasks still took turns: {changes:?}"
    );
    assert_eq!(
        s.calls("subscribe") - subscribes_before,
        1,
        "one SUBSCRIBE for the whole alternation: {changes:?}"
    );
    // And it goes once the turns are over.
    let gone = changes[first..]
        .iter()
        .find(|&&(_, n)| n == 0)
        .map(|&(t, _)| t)
        .unwrap_or_else(|| panic!("still listening 700 ms after the turns: {changes:?}"));
    // The last wait ended at most one 20 ms hold before the end: the linger runs from there.
    assert!(
        gone >= alternation_end + Duration::from_millis(100)
            && gone <= alternation_end + Duration::from_millis(600),
        "gone at {gone:?}, not about 200 ms after the turns ended at {alternation_end:?}"
    );
    client.shutdown().await.unwrap();
}

/// Both tasks ask at once, one waits for the other's 20 ms hold, then both pause 80 ms, a
/// gap shorter than the linger: each burst's wait renews the need, so one `SUBSCRIBE`
/// serves all the bursts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_closer_than_the_linger_keep_one_subscription() {
    let s = RedisServer::start();
    let name = "nu6:bursts";
    let channel = channel_name(name);
    let client = Client::connect(s.url()).await.unwrap();
    let (a, b) = (client.lock(name), client.lock(name));
    let subscribes_before = s.calls("subscribe");
    let origin = Instant::now();
    let sampler = sample_numsub(
        s.url(),
        channel.clone(),
        origin,
        Duration::from_millis(1800),
    );

    // Each take in a task of its own: reentrancy is per tokio task, so two takes joined
    // in one task would both hold at once (README).
    let take = |lock: &redis_rlock::Lock| {
        let lock = lock.clone();
        tokio::spawn(async move {
            let asked = Instant::now();
            let g = tokio::time::timeout(Duration::from_secs(5), lock.lock())
                .await
                .expect("no grant in 5 s")
                .unwrap();
            let waited = asked.elapsed();
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.unlock().await.unwrap();
            waited
        })
    };
    let bursts = 8;
    for k in 0..bursts {
        let (wa, wb) = (take(&a), take(&b));
        let (wa, wb) = (wa.await.unwrap(), wb.await.unwrap());
        let (short, long) = (wa.min(wb), wa.max(wb));
        assert!(
            short < Duration::from_millis(15) && long >= Duration::from_millis(15),
            "burst {k}: one task waits for the other (waits {wa:?}, {wb:?})"
        );
        assert!(
            long < Duration::from_millis(300),
            "burst {k}: the wait took {long:?}"
        );
        tokio::time::sleep(Duration::from_millis(80)).await;
    }
    let bursts_end = origin.elapsed();
    let changes = sampler.join().unwrap();
    println!("{bursts} bursts ended at {bursts_end:?}; NUMSUB changes: {changes:?}");
    assert_eq!(
        s.calls("subscribe") - subscribes_before,
        1,
        "one SUBSCRIBE for {bursts} bursts 80 ms apart: {changes:?}"
    );
    assert_eq!(
        changes.last().map(|&(_, n)| n),
        Some(0),
        "gone after the bursts: {changes:?}"
    );
    client.shutdown().await.unwrap();
}

/// The linger is a plain lock's, with turns on (the default): a write lock's wait, and a
/// plain lock's on a client built with `turn_window(Duration::ZERO)`, let their channel go
/// as the wait ends, not 200 ms later. Another client holds each name 150 ms meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_or_a_client_without_turns_does_not_linger() {
    let s = RedisServer::start();
    let other = Client::connect(s.url()).await.unwrap();
    let plain = Client::connect(s.url()).await.unwrap();
    let no_turns = Client::builder(s.url())
        .turn_window(Duration::ZERO)
        .build()
        .await
        .unwrap();
    let cases: [(&str, redis_rlock::Lock, redis_rlock::Lock); 3] = [
        ("plain, turns on", plain.lock("nu6:p"), other.lock("nu6:p")),
        (
            "plain, turn_window 0",
            no_turns.lock("nu6:z"),
            other.lock("nu6:z"),
        ),
        (
            "write lock",
            plain.read_write_lock("nu6:w").write(),
            other.read_write_lock("nu6:w").write(),
        ),
    ];
    let mut gone_after = Vec::new();
    for (what, ours, theirs) in cases {
        let g = theirs.lock().await.unwrap();
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            g.unlock().await.unwrap();
        });
        let asked = Instant::now();
        let mine = tokio::time::timeout(Duration::from_secs(10), ours.lock())
            .await
            .expect("no grant in 10 s")
            .unwrap();
        let granted = Instant::now();
        release.await.unwrap();
        assert!(
            granted - asked >= Duration::from_millis(100),
            "{what}: no wait"
        );
        let sampler = sample_numsub(s.url(), "*".into(), granted, Duration::from_millis(400));
        let changes = sampler.join().unwrap();
        mine.unlock().await.unwrap();
        let gone = changes
            .iter()
            .find(|&&(_, n)| n == 0)
            .map(|&(t, _)| t)
            .unwrap_or_else(|| {
                panic!("{what}: still subscribed 400 ms after the wait: {changes:?}")
            });
        println!("{what}: channels {changes:?}");
        gone_after.push((what, gone));
    }
    println!("gone after the wait: {gone_after:?}");
    assert!(
        gone_after[0].1 >= Duration::from_millis(150),
        "plain lingers: {gone_after:?}"
    );
    for &(what, gone) in &gone_after[1..] {
        assert!(
            gone < Duration::from_millis(100),
            "{what} lingered: {gone_after:?}"
        );
    }
    for c in [other, plain, no_turns] {
        c.shutdown().await.unwrap();
    }
}
