//! W1 (an uncontended lock+unlock pair, one task) on the topologies the tests start, with
//! replica sync on where it is the default: a single server, Sentinel (a master, two
//! replicas, three sentinels) and a Cluster (3 masters + 3 replicas), each in the same
//! run, as ratios to the single server. Then the same on Sentinel while one replica is
//! SIGSTOPped: 8 tasks take locks of their own at once, and the slowest pair shows
//! whether calls queue behind each other's `WAIT` (each waits at most the sync timeout,
//! 1 s by default, if they do not).
//!
//!     cargo bench --bench topologies
//!     RLOCK_TOPO_PAIRS=500 cargo bench --bench topologies

use std::time::{Duration, Instant};

use redis_rlock::Client;

#[path = "../tests/common/mod.rs"]
mod common;

use common::topology::{ClusterTopology, SentinelTopology};
use common::RedisServer;

fn pairs() -> usize {
    std::env::var("RLOCK_TOPO_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// p50 and p99 of `n` lock+unlock pairs on fresh names.
async fn w1(c: &Client, tag: &str, n: usize) -> (Duration, Duration) {
    let mut t = Vec::with_capacity(n);
    for i in 0..n {
        let lock = c.lock(format!("{{{tag}}}:w1:{}", i % 16));
        let at = Instant::now();
        lock.lock().await.unwrap().unlock().await.unwrap();
        t.push(at.elapsed());
    }
    t.sort();
    (t[n / 2], t[n * 99 / 100])
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let n = pairs();
    let single = RedisServer::start();
    let sentinel = SentinelTopology::start();
    let cluster = ClusterTopology::start();
    rt.block_on(async {
        let c = Client::connect(single.url()).await.unwrap();
        w1(&c, "warm", 50).await;
        let (s50, s99) = w1(&c, "single", n).await;
        println!("single server: W1 pair p50 {s50:?} p99 {s99:?}");

        let sc = Client::sentinel(&sentinel.sentinel_urls(), &sentinel.master_name)
            .build()
            .await
            .unwrap();
        w1(&sc, "warm", 50).await;
        let (p50, p99) = w1(&sc, "sentinel", n).await;
        println!(
            "sentinel, sync on: W1 pair p50 {p50:?} p99 {p99:?}: {:.2}x of the single server's p50",
            p50.as_secs_f64() / s50.as_secs_f64()
        );

        let cc = Client::cluster(&cluster.urls()).build().await.unwrap();
        w1(&cc, "warm", 50).await;
        let (c50, c99) = w1(&cc, "cluster", n).await;
        println!(
            "cluster, sync on: W1 pair p50 {c50:?} p99 {c99:?}: {:.2}x of the single server's p50",
            c50.as_secs_f64() / s50.as_secs_f64()
        );

        // One replica paused: the other still acknowledges, so every WAIT is answered;
        // a call must not wait behind another's.
        let paused = &sentinel.replicas[0];
        paused.signal("STOP");
        let started = Instant::now();
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let sc = sc.clone();
                tokio::spawn(async move {
                    let mut slowest = Duration::ZERO;
                    for i in 0..20 {
                        let at = Instant::now();
                        let g = sc.lock(format!("paused:{t}:{i}")).lock().await.unwrap();
                        g.unlock().await.unwrap();
                        slowest = slowest.max(at.elapsed());
                    }
                    slowest
                })
            })
            .collect();
        let mut slowest = Duration::ZERO;
        for t in tasks {
            slowest = slowest.max(t.await.unwrap());
        }
        paused.signal("CONT");
        println!(
            "sentinel, one replica SIGSTOPped: 8 tasks x 20 pairs in {:?}; slowest pair {slowest:?}",
            started.elapsed()
        );
    });
}
