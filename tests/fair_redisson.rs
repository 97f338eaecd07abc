//! The fair lock in one queue with Redisson's (issue 25): a peer running Redisson 4.7's
//! fair-lock scripts and `lock()` loop (`tests/common/redisson_fair.rs`) and this crate's
//! waiters are served in the order they came whoever takes the lock, no live waiter is
//! ever purged or sent to the back, and a crashed waiter of this crate is passed over
//! within its bound (`docs/protocol.md` 8.4).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redisson_fair::FairPeer;
use common::RedisServer;
use parking_lot::Mutex;
use redis_rlock::protocol::{queue_key, timeout_key};
use redis_rlock::Client;

/// Redisson's default `fairLockWaitTimeout`, which is also this crate's.
const WAIT: Duration = Duration::from_secs(300);

fn queue(url: &str, name: &str) -> Vec<String> {
    common::raw_cmd(url, &["LRANGE", &queue_key(name), "0", "-1"]).unwrap()
}

fn server_ms(url: &str) -> i64 {
    let t: Vec<String> = common::raw_cmd(url, &["TIME"]).unwrap();
    t[0].parse::<i64>().unwrap() * 1000 + t[1].parse::<i64>().unwrap() / 1000
}

/// The waiters whose deadline has passed: any purge run now would drop them when they
/// reach the head, alive or not.
fn overdue(url: &str, name: &str) -> Vec<String> {
    let now = server_ms(url);
    queue(url, name)
        .into_iter()
        .filter(|w| {
            let d: Option<f64> = common::raw_cmd(url, &["ZSCORE", &timeout_key(name), w]).unwrap();
            d.is_none_or(|d| d <= now as f64)
        })
        .collect()
}

/// Every queue seen, polled every 2 ms on its own thread until stopped (at most 60 s).
struct Watch {
    stop: Arc<AtomicBool>,
    seen: std::thread::JoinHandle<Vec<Vec<String>>>,
}

impl Watch {
    fn start(url: &str, name: &str) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let (url, name, flag) = (url.to_string(), name.to_string(), stop.clone());
        let seen = std::thread::spawn(move || {
            let (start, mut seen) = (Instant::now(), Vec::<Vec<String>>::new());
            while !flag.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(60) {
                let q = queue(&url, &name);
                if seen.last() != Some(&q) {
                    seen.push(q);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        });
        Watch { stop, seen }
    }

    /// Asserts that each queue seen kept the arrival order and that no waiter came back
    /// after it left (a purged waiter that joins again shows as either).
    fn assert_no_requeue(self, arrival: &[String]) {
        self.stop.store(true, Ordering::SeqCst);
        let seen = self.seen.join().unwrap();
        let mut left: Vec<String> = Vec::new();
        let mut before: Vec<String> = Vec::new();
        for q in &seen {
            let at: Vec<usize> = q
                .iter()
                .map(|w| arrival.iter().position(|a| a == w).expect("a stranger"))
                .collect();
            assert!(
                at.windows(2).all(|p| p[0] < p[1]),
                "the queue left the arrival order: {q:?} (seen: {seen:?})"
            );
            left.extend(before.iter().filter(|w| !q.contains(w)).cloned());
            if let Some(back) = q.iter().find(|w| left.contains(w)) {
                panic!("{back} left the queue and came back: {seen:?}");
            }
            before = q.clone();
        }
    }
}

type Order = Arc<Mutex<Vec<(&'static str, Instant)>>>;

/// A crate waiter: takes the lock, notes it, holds it `hold`, lets it go.
fn crate_waiter(
    c: &Client,
    name: &str,
    tag: &'static str,
    hold: Duration,
    order: &Order,
) -> tokio::task::JoinHandle<()> {
    let (lock, order) = (c.fair_lock(name), order.clone());
    tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        order.lock().push((tag, Instant::now()));
        tokio::time::sleep(hold).await;
        g.unlock().await.unwrap();
    })
}

/// A Redisson waiter running its `lock()` loop; `check` runs right after its grant.
fn peer_waiter(
    peer: &FairPeer,
    tag: &'static str,
    hold: Duration,
    order: &Order,
    check: impl FnOnce() + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let (peer, order) = (peer.clone(), order.clone());
    tokio::task::spawn_blocking(move || {
        let at = peer
            .lock(Duration::from_secs(30))
            .expect("the peer never got the lock");
        order.lock().push((tag, at));
        check();
        std::thread::sleep(hold);
        assert_eq!(peer.unlock(), Some(1));
    })
}

/// Waits until the queue is `n` long; returns its last waiter.
async fn joined(url: &str, name: &str, n: usize) -> String {
    assert!(
        common::eventually(Duration::from_secs(5), || queue(url, name).len() == n).await,
        "waiter {n} never joined: {:?}",
        queue(url, name)
    );
    queue(url, name).pop().unwrap()
}

async fn finish(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(40), t)
            .await
            .expect("a waiter was never served")
            .unwrap();
    }
}

fn tags(order: &Order) -> Vec<&'static str> {
    order.lock().iter().map(|o| o.0).collect()
}

/// After every grant, no waiter still in line may be overdue.
fn none_overdue(
    url: &str,
    name: &str,
    overdue_seen: &Arc<Mutex<Vec<String>>>,
) -> impl FnOnce() + Send + 'static {
    let (url, name, seen) = (url.to_string(), name.to_string(), overdue_seen.clone());
    move || seen.lock().extend(overdue(&url, &name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crate_waiter_between_redisson_waiters_is_served_in_its_place() {
    let s = RedisServer::start();
    let (url, name) = (s.url(), "fr:rcr");
    let c = Client::connect(&url).await.unwrap();
    let holder = FairPeer::new(&url, name, 0, WAIT);
    assert_eq!(holder.try_acquire(), None);
    let watch = Watch::start(&url, name);
    let (order, late) = (Order::default(), Arc::new(Mutex::new(Vec::new())));
    let hold = Duration::from_millis(200);
    let r1 = FairPeer::new(&url, name, 1, WAIT);
    let r3 = FairPeer::new(&url, name, 3, WAIT);
    let mut tasks = vec![peer_waiter(
        &r1,
        "redisson 1",
        hold,
        &order,
        none_overdue(&url, name, &late),
    )];
    let mut arrival = vec![joined(&url, name, 1).await];
    tasks.push(crate_waiter(&c, name, "crate 2", hold, &order));
    arrival.push(joined(&url, name, 2).await);
    tasks.push(peer_waiter(&r3, "redisson 3", hold, &order, || {}));
    arrival.push(joined(&url, name, 3).await);
    assert_eq!(holder.unlock(), Some(1));
    finish(tasks).await;
    assert_eq!(tags(&order), ["redisson 1", "crate 2", "redisson 3"]);
    assert!(
        late.lock().is_empty(),
        "overdue after redisson 1 took the lock: {:?}",
        late.lock()
    );
    watch.assert_no_requeue(&arrival);
    assert!(queue(&url, name).is_empty());
    assert_eq!(s.cmd::<i64>(&["EXISTS", &timeout_key(name)]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_waiter_between_crate_waiters_hands_on_to_the_last_at_once() {
    let s = RedisServer::start();
    let (url, name) = (s.url(), "fr:crc");
    let (a, b) = (
        Client::connect(&url).await.unwrap(),
        Client::connect(&url).await.unwrap(),
    );
    let holder = FairPeer::new(&url, name, 0, WAIT);
    assert_eq!(holder.try_acquire(), None);
    let watch = Watch::start(&url, name);
    let (order, late) = (Order::default(), Arc::new(Mutex::new(Vec::new())));
    let hold = Duration::from_millis(200);
    let r2 = FairPeer::new(&url, name, 2, WAIT);
    let mut tasks = vec![crate_waiter(&a, name, "crate 1", hold, &order)];
    let mut arrival = vec![joined(&url, name, 1).await];
    tasks.push(peer_waiter(
        &r2,
        "redisson 2",
        hold,
        &order,
        none_overdue(&url, name, &late),
    ));
    arrival.push(joined(&url, name, 2).await);
    tasks.push(crate_waiter(&b, name, "crate 3", hold, &order));
    arrival.push(joined(&url, name, 3).await);
    assert_eq!(holder.unlock(), Some(1));
    finish(tasks).await;
    assert_eq!(tags(&order), ["crate 1", "redisson 2", "crate 3"]);
    assert!(
        late.lock().is_empty(),
        "overdue after redisson 2 took the lock: {:?}",
        late.lock()
    );
    // Redisson 2's unlock told crate 3, which took the lock then, not at its next attempt.
    let o = order.lock().clone();
    let handed = o[2].1.duration_since(o[1].1) - hold;
    eprintln!("FIGURE redisson_unlock_to_crate_grant {handed:?}");
    assert!(
        handed < Duration::from_millis(500),
        "crate 3 came {handed:?} after the unlock"
    );
    watch.assert_no_requeue(&arrival);
    assert!(queue(&url, name).is_empty());
}

/// The third case: Redisson 1 takes the lock and keeps it past the old 5 s
/// horizon; the crate waiter and the Redisson waiter behind it keep their places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_behind_a_long_redisson_hold_keep_their_places() {
    let s = RedisServer::start();
    let (url, name) = (s.url(), "fr:long");
    let c = Client::connect(&url).await.unwrap();
    let holder = FairPeer::new(&url, name, 0, WAIT);
    assert_eq!(holder.try_acquire(), None);
    let order = Order::default();
    let r1 = FairPeer::new(&url, name, 1, WAIT);
    let r3 = FairPeer::new(&url, name, 3, WAIT);
    let short = Duration::from_millis(100);
    let mut tasks = vec![peer_waiter(
        &r1,
        "redisson 1",
        Duration::from_millis(6500),
        &order,
        || {},
    )];
    let mut arrival = vec![joined(&url, name, 1).await];
    tasks.push(crate_waiter(&c, name, "crate 2", short, &order));
    arrival.push(joined(&url, name, 2).await);
    tasks.push(peer_waiter(&r3, "redisson 3", short, &order, || {}));
    arrival.push(joined(&url, name, 3).await);
    let watch = Watch::start(&url, name);
    assert_eq!(holder.unlock(), Some(1));
    assert!(common::eventually(Duration::from_secs(5), || !order.lock().is_empty()).await);
    // Through the hold: the queue stays as it was, and nobody in it is overdue.
    let until = Instant::now() + Duration::from_millis(6000);
    while Instant::now() < until {
        assert_eq!(queue(&url, name), arrival[1..], "a waiter lost its place");
        assert_eq!(
            overdue(&url, name),
            Vec::<String>::new(),
            "a live waiter is overdue"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    finish(tasks).await;
    assert_eq!(tags(&order), ["redisson 1", "crate 2", "redisson 3"]);
    watch.assert_no_requeue(&arrival);
}

/// A waiter of this crate that crashed in line (its connections black-holed: it neither
/// asks again nor leaves) is passed over once its deadline passes: at most the wait
/// timeout after its last attempt, or the deadline it was given on joining (the lock's
/// PTTL then + the wait timeout), whichever is later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_crate_waiter_is_passed_over_within_its_bound() {
    let s = RedisServer::start();
    let (url, name) = (s.url(), "fr:crash");
    let wait = Duration::from_millis(1500);
    let lease = Duration::from_millis(900);
    let build = |url: String| async move {
        Client::builder(url)
            .watchdog_timeout(lease)
            .fair_lock_wait_timeout(wait)
            .build()
            .await
            .unwrap()
    };
    let holder = build(url.clone()).await;
    let g = holder.fair_lock(name).lock().await.unwrap();
    let proxy = common::proxy::Proxy::start(s.port).await;
    let doomed = build(proxy.url()).await;
    let order = Order::default();
    let _doomed = crate_waiter(&doomed, name, "crashed", Duration::ZERO, &order);
    joined(&url, name, 1).await;
    proxy.set_blackhole(true);
    let crashed = Instant::now();
    let live = build(url.clone()).await;
    let next = crate_waiter(&live, name, "live", Duration::ZERO, &order);
    joined(&url, name, 2).await;
    g.unlock().await.unwrap();
    finish(vec![next]).await;
    let took = order.lock()[0].1.duration_since(crashed);
    let bound = lease + wait + Duration::from_millis(300);
    eprintln!("FIGURE crashed_crate_waiter_passed_over_after {took:?}");
    assert!(
        took < bound,
        "the live waiter waited {took:?} behind a crashed one (bound {bound:?})"
    );
    assert_eq!(tags(&order), ["live"]);
    assert!(queue(&url, name).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_timeout_out_of_range_is_refused() {
    let s = RedisServer::start();
    for bad in [
        Duration::ZERO,
        Duration::from_millis(29),
        Duration::from_millis((1 << 40) + 1),
        Duration::MAX,
    ] {
        let r = Client::builder(s.url())
            .fair_lock_wait_timeout(bad)
            .build()
            .await;
        assert!(
            matches!(r, Err(redis_rlock::Error::InvalidConfig(_))),
            "{bad:?}: {:?}",
            r.err()
        );
    }
    let ok = Client::builder(s.url())
        .fair_lock_wait_timeout(Duration::from_millis(30))
        .build()
        .await;
    assert!(ok.is_ok());
}
