//! Adversarial review of the linger rule of `94919dc` (`docs/protocol.md` 1.4): a lock
//! channel lingers 200 ms from when a waiter last needed it, and a call that joins a
//! lingering channel before its first attempt and is granted at once does not extend
//! it. Attacked here: a call that joins early at the moment the linger runs out and is
//! then answered busy (does it hear the release, or sleep to the holder's lease?), names
//! sharing a channel (`a` and `{a}`) with turns on and off, and cancelled early joiners.
//! The holder is always another client with a 3 s lease: a waiter that missed the
//! release would wait about that long, against a few ms when it hears it.

mod common;

use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::protocol::channel_name;
use redis_rlock::{Client, Lock, LockGuard};

/// The holder's lease: what a waiter that missed the release sleeps to.
const LEASE: Duration = Duration::from_secs(3);
/// The longest a waiter may take after a release it should hear: far below `LEASE`,
/// far above a debug build's hand-over chain of 3 tasks on a loaded machine.
const HEARD: Duration = Duration::from_millis(1_000);

async fn client(s: &RedisServer, turn_window: Option<Duration>) -> Client {
    let b = Client::builder(s.url());
    let b = match turn_window {
        Some(w) => b.turn_window(w),
        None => b,
    };
    b.build().await.unwrap()
}

/// Each of `ws` needs `lock`'s channel once: `h` holds it 20 ms while one task of each
/// waits. Returns when the last of those calls returned (its subscription left, so its
/// client's linger counts from about then).
async fn wait_once(h: &Lock, ws: &[Lock]) -> Instant {
    let held = h.lock_with_lease(LEASE).await.unwrap();
    let waiters: Vec<_> = ws
        .iter()
        .map(|w| {
            let w = w.clone();
            tokio::spawn(async move {
                let g = w.lock().await.unwrap();
                let left = Instant::now();
                g.unlock().await.unwrap();
                left
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    held.unlock().await.unwrap();
    let mut last = Instant::now() - Duration::from_secs(1);
    for w in waiters {
        let left = tokio::time::timeout(LEASE * 2, w)
            .await
            .expect("a first waiter heard the release")
            .unwrap();
        last = last.max(left);
    }
    last
}

/// One waiting call of `lock`, by `lock()` or `try_lock_for()`: when it got the lock.
async fn take(lock: Lock, bounded: bool) -> Instant {
    let g: LockGuard = if bounded {
        lock.try_lock_for(LEASE * 2, None)
            .await
            .unwrap()
            .expect("try_lock_for ran out of time: it slept past the release")
    } else {
        lock.lock().await.unwrap()
    };
    let got = Instant::now();
    g.unlock().await.unwrap();
    got
}

/// Sweeps the start of waiting calls across the moment their clients' linger on the
/// channel runs out (195-205 ms after the wait that needed it, 250 µs apart), with
/// `clients` waiting clients of 1-3 tasks each and the holder letting go 0-24 ms later.
/// Returns the longest delay from the release to a waiter's grant, and in how many
/// rounds a client subscribed anew (its linger had run out) and in how many none did
/// (all joined their lingering channel).
/// How long after `released` the task `sleeper` got its lock (it must within twice the
/// lease).
async fn delay_after(sleeper: tokio::task::JoinHandle<Instant>, released: Instant) -> Duration {
    let got = tokio::time::timeout(LEASE * 2, sleeper)
        .await
        .expect("the sleeper never got the lock")
        .unwrap();
    got.saturating_duration_since(released)
}

async fn sweep(
    s: &RedisServer,
    name: &str,
    of_h: impl Fn(&Client) -> Lock,
    of_w: impl Fn(&Client) -> Lock,
    rounds: u64,
    clients: usize,
) -> (Duration, u64, u64) {
    let hc = client(s, None).await;
    let mut wcs = Vec::new();
    for _ in 0..clients {
        wcs.push(client(s, None).await);
    }
    let h = of_h(&hc);
    let ws: Vec<Lock> = wcs.iter().map(&of_w).collect();
    let mut worst = Duration::ZERO;
    let (mut fresh, mut lingering) = (0, 0);
    for i in 0..rounds {
        // 190-225 ms: both sides of the linger's end, with room for a timer that fires
        // late on a loaded machine.
        let offset = Duration::from_micros(190_000 + (i % 40) * 1_000);
        let tasks = 1 + (i % 3) as usize;
        let needed = wait_once(&h, &ws).await;
        let held = h.lock_with_lease(LEASE).await.unwrap();
        tokio::time::sleep_until((needed + offset).into()).await;
        let subscribes = s.calls("subscribe");
        let mut waiters = Vec::new();
        for (c, w) in ws.iter().enumerate() {
            for k in 0..tasks {
                let bounded = (i + (c + k) as u64) % 2 == 1;
                waiters.push(tokio::spawn(take(w.clone(), bounded)));
            }
        }
        tokio::time::sleep(Duration::from_millis((i * 7) % 25)).await;
        let released = Instant::now();
        held.unlock().await.unwrap();
        for t in waiters {
            let got = tokio::time::timeout(LEASE * 3, t)
                .await
                .expect("a waiter never got the lock")
                .unwrap();
            let delay = got.saturating_duration_since(released);
            assert!(
                delay < HEARD,
                "{name}: round {i} ({clients} clients x {tasks} tasks, started {offset:?} after \
                 the wait) got the lock {delay:?} after the release: it slept through it"
            );
            if delay > Duration::from_millis(20) {
                println!(
                    "SLOW {name}: round {i} ({clients} x {tasks}, {offset:?}) {delay:?} after the release"
                );
            }
            worst = worst.max(delay);
        }
        if s.calls("subscribe") > subscribes {
            fresh += 1;
        } else {
            lingering += 1;
        }
    }
    hc.shutdown().await.unwrap();
    for c in wcs {
        c.shutdown().await.unwrap();
    }
    (worst, fresh, lingering)
}

/// Finding 1 (none): a plain lock's waiting calls that start as the linger runs out,
/// either side of it, in one client or two (turns on), are answered busy, sleep, and
/// hear the holder's release. The
/// sweep must land on both sides (some rounds join the lingering channel, some
/// subscribe anew), or it tested one path only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_join_racing_the_end_of_the_linger_still_hears_the_release() {
    let s = RedisServer::start();
    let name = "advl:race";
    for clients in [1, 2] {
        let (worst, fresh, lingering) =
            sweep(&s, name, |c| c.lock(name), |c| c.lock(name), 36, clients).await;
        println!(
            "FIGURE plain, {clients} waiting clients: worst {worst:?}; a client subscribed anew \
             in {fresh} rounds, all joined lingering in {lingering}"
        );
        assert!(fresh > 0, "no round started after the linger ran out");
        assert!(lingering > 0, "no round joined the lingering channel");
    }
}

/// The same sweep for the kinds that never join early (a fair lock listens on a channel
/// of its own waiter, a read-write lock's channel does not linger): the change left
/// them as they were, each waiter hears the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_and_read_write_waiters_started_near_the_linger_hear_the_release() {
    let s = RedisServer::start();
    let fair = "advl:fair";
    let (worst, ..) = sweep(&s, fair, |c| c.fair_lock(fair), |c| c.fair_lock(fair), 9, 1).await;
    println!("FIGURE fair: worst {worst:?}");
    let rw = "advl:rw";
    let write = |c: &Client| c.read_write_lock(rw).write();
    let (worst, ..) = sweep(&s, rw, write, write, 9, 1).await;
    println!("FIGURE write behind write: worst {worst:?}");
    let read = |c: &Client| c.read_write_lock(rw).read();
    let (worst, ..) = sweep(&s, rw, write, read, 9, 2).await;
    println!("FIGURE read behind write: worst {worst:?}");
}

/// Finding 2 (none): a task sleeps on `a` (held by another client) while another task
/// of the same client takes `{a}`, which shares the channel, again and again, each
/// joining early and granted at once. The channel stays while the sleeper needs it
/// (sampled at every pair), the sleeper hears the release, and once it left the pairs
/// do not keep the channel: it goes within the linger and some slack, as with turns off
/// (no linger at all).
async fn shared_channel(turn_window: Option<Duration>, tag: &str) {
    let s = RedisServer::start();
    let (hc, wc) = (client(&s, turn_window).await, client(&s, turn_window).await);
    let (a, braced) = (tag.to_string(), format!("{{{tag}}}"));
    let channel = channel_name(&a);
    assert_eq!(channel, channel_name(&braced), "the names share a channel");
    let held = hc.lock(a.as_str()).lock_with_lease(LEASE).await.unwrap();
    let sleeper = tokio::spawn(take(wc.lock(a.as_str()), false));
    assert!(
        common::eventually(Duration::from_secs(2), || s.numsub(&channel) == 1).await,
        "the sleeper never subscribed"
    );
    let other = wc.lock(braced.as_str());
    let start = Instant::now();
    let mut pairs = 0u32;
    // Bounded in count and time: well past the linger of anything before.
    while start.elapsed() < Duration::from_millis(600) && pairs < 20_000 {
        other.lock().await.unwrap().unlock().await.unwrap();
        pairs += 1;
        if pairs.is_multiple_of(16) {
            assert_eq!(
                s.numsub(&channel),
                1,
                "{tag}: the channel went after {pairs} pairs on {braced} while a task slept on {a}"
            );
        }
    }
    assert!(!sleeper.is_finished(), "the sleeper got a lock still held");
    let released = Instant::now();
    held.unlock().await.unwrap();
    let delay = delay_after(sleeper, released).await;
    assert!(
        delay < HEARD,
        "{tag}: the sleeper got {a} {delay:?} after the release"
    );
    let left = Instant::now();
    let mut more = 0u32;
    while left.elapsed() < Duration::from_millis(700) && more < 20_000 {
        other.lock().await.unwrap().unlock().await.unwrap();
        more += 1;
    }
    let listening = s.numsub(&channel);
    println!(
        "FIGURE {tag}: {pairs} pairs while asleep, {more} after, sleeper's delay {delay:?}, listening {listening}"
    );
    assert_eq!(
        listening, 0,
        "{tag}: still subscribed 700 ms after the sleeper left, {more} pairs on {braced} since"
    );
    hc.shutdown().await.unwrap();
    wc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_sharing_a_channel_keep_it_while_needed_and_not_after_turns_on() {
    shared_channel(None, "advl-on").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_sharing_a_channel_keep_it_while_needed_and_not_after_turns_off() {
    shared_channel(Some(Duration::ZERO), "advl-off").await;
}

/// Finding 3 (none): calls that join the lingering channel early and are cancelled at
/// every stage (before their first answer, asleep, just woken) neither lose the release
/// for a task asleep beside them nor keep the channel for good: it goes within the
/// linger and some slack after the last of them. Then calls on the free lock, cancelled
/// at varied points for a second, do not keep it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_early_joiners_neither_lose_a_release_nor_keep_the_channel() {
    let s = RedisServer::start();
    let name = "advl:cancel";
    let channel = channel_name(name);
    let (hc, wc) = (client(&s, None).await, client(&s, None).await);
    let (h, w) = (hc.lock(name), wc.lock(name));
    // A client's calls queue behind its own sleeper on the same name without an
    // attempt, so the early joiners take the other name on the channel.
    let braced = "{advl:cancel}";
    let (hb, wb) = (hc.lock(braced), wc.lock(braced));
    for round in 0..8u64 {
        wait_once(&h, std::slice::from_ref(&w)).await;
        let held = h.lock_with_lease(LEASE).await.unwrap();
        let held_b = hb.lock_with_lease(LEASE).await.unwrap();
        let sleeper = tokio::spawn(take(w.clone(), round % 2 == 1));
        assert!(
            common::eventually(Duration::from_secs(2), || s.numsub(&channel) == 1).await,
            "the sleeper is not subscribed"
        );
        let mut cancelled = Vec::new();
        for k in 0..16u64 {
            let w = wb.clone();
            // Half before their first answer comes (a loopback round trip), half later.
            let span = if k % 2 == 0 { 600 } else { 4_000 };
            let limit = Duration::from_micros((k * 397 + round * 131) % span);
            cancelled.push(tokio::spawn(async move {
                let got = tokio::time::timeout(limit, w.lock()).await;
                assert!(got.is_err(), "a cancelled call got a lock still held");
            }));
        }
        for c in cancelled {
            c.await.unwrap();
        }
        assert_eq!(
            s.numsub(&channel),
            1,
            "round {round}: the channel went with cancelled calls while a task slept on it"
        );
        // In odd rounds, calls cancelled around the release, some woken by it then
        // dropped (their wake-up passes on); their grants hand over to the sleeper.
        let racing: Vec<_> = (0..4u64)
            .filter(|_| round % 2 == 1)
            .map(|k| {
                let w = w.clone();
                tokio::spawn(async move {
                    let limit = Duration::from_millis(10 + k * 3 + round);
                    if let Ok(Ok(g)) = tokio::time::timeout(limit, w.lock()).await {
                        g.unlock().await.unwrap();
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(5 + round * 2)).await;
        let released = Instant::now();
        held.unlock().await.unwrap();
        held_b.unlock().await.unwrap();
        let delay = delay_after(sleeper, released).await;
        assert!(
            delay < HEARD,
            "round {round}: the sleeper got the lock {delay:?} after the release"
        );
        for r in racing {
            r.await.unwrap();
        }
    }
    let last = Instant::now();
    assert!(
        common::eventually(Duration::from_millis(1_000), || s.numsub(&channel) == 0).await,
        "still subscribed 1 s after the last waiter"
    );
    println!(
        "FIGURE unsubscribed {:?} after the last waiter",
        last.elapsed()
    );

    // Calls on the free lock cancelled at varied points, after one wait.
    wait_once(&h, std::slice::from_ref(&w)).await;
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(1) && n < 50_000 {
        let limit = Duration::from_micros((n * 173) % 1_500);
        if let Ok(Ok(g)) = tokio::time::timeout(limit, w.lock()).await {
            g.unlock().await.unwrap();
        }
        n += 1;
    }
    let listening = s.numsub(&channel);
    assert_eq!(
        listening, 0,
        "still subscribed after {n} cancelled or granted calls that never waited"
    );
    // Nothing left held by a cancelled call: the name is free to another client.
    let free = h.try_lock_for(Duration::from_secs(2), None).await.unwrap();
    assert!(free.is_some(), "a cancelled call left the lock held");
    free.unwrap().unlock().await.unwrap();
    hc.shutdown().await.unwrap();
    wc.shutdown().await.unwrap();
}

/// `clients` of one task each take `name` in a loop for `run`, holding it `hold` and
/// pausing `pause` after each release: acquisitions, and the `SUBSCRIBE`s sent.
async fn contended(
    s: &RedisServer,
    clients: usize,
    name: &str,
    hold: Duration,
    pause: Duration,
) -> (u64, u64) {
    let mut cs = Vec::new();
    for _ in 0..clients {
        cs.push(client(s, None).await);
    }
    let subscribes = s.calls("subscribe");
    let until = Instant::now() + Duration::from_secs(1);
    let tasks: Vec<_> = cs
        .iter()
        .map(|c| {
            let lock = c.lock(name);
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < until && n < 5_000 {
                    let g = lock.lock().await.unwrap();
                    tokio::time::sleep(hold).await;
                    g.unlock().await.unwrap();
                    n += 1;
                    tokio::time::sleep(pause).await;
                }
                n
            })
        })
        .collect();
    let mut n = 0;
    for t in tasks {
        n += tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .unwrap()
            .unwrap();
    }
    let subscribed = s.calls("subscribe") - subscribes;
    for c in cs {
        c.shutdown().await.unwrap();
    }
    (n, subscribed)
}

/// The linger still serves contended loops: clients whose tasks take a lock one after
/// another, often answered busy, subscribe each lock channel a few times, not once per
/// wait, though most of their calls are granted at once and no longer extend it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_loops_still_keep_the_channel() {
    let s = RedisServer::start();
    for (i, (clients, hold, pause)) in [(2, 1, 0), (3, 1, 1), (2, 2, 5), (2, 2, 50)]
        .into_iter()
        .enumerate()
    {
        let name = format!("advl:loop{i}");
        let (hold, pause) = (Duration::from_millis(hold), Duration::from_millis(pause));
        let (n, subscribed) = contended(&s, clients, &name, hold, pause).await;
        println!(
            "FIGURE {clients} clients, hold {hold:?}, pause {pause:?}: {n} acquisitions, {subscribed} SUBSCRIBEs"
        );
        assert!(n > 10, "only {n} acquisitions");
        assert!(
            subscribed <= clients as u64 * 3,
            "{subscribed} SUBSCRIBEs for {n} acquisitions of {clients} clients"
        );
    }
}
