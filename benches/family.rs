//! The synchronizer family, measured against the Redis round trip of the same run: a
//! semaphore's acquire/release pair, a fair lock's hand-off between clients and its
//! order, readers against one writer on a read-write lock, and a latch waking N waiters.
//!
//!     cargo bench --bench family
//!
//! Uses `REDIS_URL` when set; otherwise starts a redis-server on a free loopback port.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis_rlock::Client;

#[path = "common/server.rs"]
mod server;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p) as usize]
}

/// Mean time of one raw EVALSHA of a trivial script: the round trip.
async fn rtt(url: &str) -> Duration {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let script = redis::Script::new("return redis.call('exists', KEYS[1])");
    let n = 2000;
    let start = Instant::now();
    for _ in 0..n {
        let _: i64 = script.key("rtt").invoke_async(&mut c).await.unwrap();
    }
    start.elapsed() / n
}

async fn semaphore_pairs(url: &str, rtt: Duration) {
    let c = Client::connect(url).await.unwrap();
    let sem = c.semaphore("fam:sem");
    sem.try_set_permits(1).await.unwrap();
    let n = 2000;
    let start = Instant::now();
    for _ in 0..n {
        sem.acquire(1).await.unwrap();
        sem.release(1).await.unwrap();
    }
    let pair = start.elapsed() / n;
    println!(
        "semaphore acquire+release pair: {pair:?} ({:.2}x of 2 RTT)",
        (rtt * 2).as_secs_f64() / pair.as_secs_f64()
    );
}

/// `clients` clients, one task each, take the fair lock in turn for `secs`: grants/s,
/// hand-off (one holder's unlock to the next holder's grant) p50/p99, and how often a
/// client was served out of its turn (a client served twice while another waited).
async fn fair_handoff(url: &str, clients: usize, secs: u64, rtt: Duration) {
    let until = Instant::now() + Duration::from_secs(secs);
    let last_release = Arc::new(Mutex::new(None::<Instant>));
    let handoffs = Arc::new(Mutex::new(Vec::new()));
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for id in 0..clients {
        let c = Client::connect(url).await.unwrap();
        let (last_release, handoffs, served) =
            (last_release.clone(), handoffs.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            let lock = c.fair_lock("fam:fair");
            while Instant::now() < until {
                let left = until.saturating_duration_since(Instant::now());
                let Ok(Some(g)) = lock.try_lock_for(left, None).await else {
                    break;
                };
                if let Some(r) = *last_release.lock() {
                    handoffs.lock().push(r.elapsed());
                }
                served.lock().push(id);
                *last_release.lock() = Some(Instant::now());
                g.unlock().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut h = handoffs.lock().clone();
    let served = served.lock().clone();
    // In a fair run of `clients` clients, any `clients` grants in a row go to distinct
    // clients.
    let windows = served.windows(clients).count().max(1);
    let unfair = served
        .windows(clients)
        .filter(|w| {
            let mut v = w.to_vec();
            v.sort();
            v.dedup();
            v.len() < clients
        })
        .count();
    println!(
        "fair lock, {clients} clients: {:.0} grants/s; hand-off p50 {:?} ({:.1} RTT) p99 {:?}; out of turn {:.1}% of windows",
        served.len() as f64 / secs as f64,
        pct(&mut h, 0.5),
        pct(&mut h, 0.5).as_secs_f64() / rtt.as_secs_f64(),
        pct(&mut h, 0.99),
        100.0 * unfair as f64 / windows as f64
    );
}

/// `readers` tasks take the read lock in a loop and one task the write lock, for `secs`.
async fn readers_and_a_writer(url: &str, readers: usize, secs: u64) {
    let c = Client::connect(url).await.unwrap();
    let until = Instant::now() + Duration::from_secs(secs);
    let (reads, writes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writing = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..readers {
        let (lock, reads, writing) = (
            c.read_write_lock("fam:rw").read(),
            reads.clone(),
            writing.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let g = lock.lock().await.unwrap();
                assert!(
                    !writing.load(Ordering::SeqCst),
                    "a reader inside with the writer"
                );
                reads.fetch_add(1, Ordering::Relaxed);
                g.unlock().await.unwrap();
            }
        }));
    }
    let (lock, w, writing) = (
        c.read_write_lock("fam:rw").write(),
        writes.clone(),
        writing.clone(),
    );
    tasks.push(tokio::spawn(async move {
        while Instant::now() < until {
            let left = until.saturating_duration_since(Instant::now());
            let Ok(Some(g)) = lock.try_lock_for(left, None).await else {
                break;
            };
            writing.store(true, Ordering::SeqCst);
            w.fetch_add(1, Ordering::Relaxed);
            writing.store(false, Ordering::SeqCst);
            g.unlock().await.unwrap();
        }
    }));
    for t in tasks {
        t.await.unwrap();
    }
    println!(
        "read-write lock, {readers} readers and 1 writer: {:.0} reads/s, {:.0} writes/s",
        reads.load(Ordering::Relaxed) as f64 / secs as f64,
        writes.load(Ordering::Relaxed) as f64 / secs as f64
    );
}

/// `n` waiters (on `clients` clients) wait on a latch; the time from the last
/// count-down to each waiter's wake-up.
async fn latch_wake(url: &str, n: usize, clients: usize) {
    let mut cs = Vec::new();
    for _ in 0..clients {
        cs.push(Client::connect(url).await.unwrap());
    }
    let latch = cs[0].count_down_latch("fam:latch");
    latch.try_set_count(1).await.unwrap();
    let woke = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (l, woke) = (cs[i % clients].count_down_latch("fam:latch"), woke.clone());
        tasks.push(tokio::spawn(async move {
            assert!(l.wait_for(Duration::from_secs(30)).await.unwrap());
            woke.lock().push(Instant::now());
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let at = Instant::now();
    latch.count_down().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let mut d: Vec<Duration> = woke.lock().iter().map(|w| w.duration_since(at)).collect();
    println!(
        "latch, {n} waiters on {clients} clients: woken p50 {:?} p99 {:?} max {:?} after the count-down",
        pct(&mut d, 0.5),
        pct(&mut d, 0.99),
        pct(&mut d, 1.0)
    );
}

fn main() {
    let (url, _server) = server::start_server();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let rtt = rtt(&url).await;
        println!("round trip (raw EVALSHA): {rtt:?}");
        semaphore_pairs(&url, rtt).await;
        fair_handoff(&url, 8, 3, rtt).await;
        readers_and_a_writer(&url, 8, 3).await;
        latch_wake(&url, 100, 4).await;
    });
}
