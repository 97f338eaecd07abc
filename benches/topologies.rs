//! W1 (an uncontended lock+unlock pair, one task) on the topologies the tests start, with
//! replica sync on where it is the default: a single server, Sentinel (a master, two
//! replicas, three sentinels) and a Cluster (3 masters + 3 replicas), in the same run, a
//! pair on each in turn, as ratios to the single server. Then the same on Sentinel while one replica is
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

/// Times of one pair: the lock, the unlock and the two together.
struct Pairs {
    lock: Vec<Duration>,
    unlock: Vec<Duration>,
    pair: Vec<Duration>,
}

impl Pairs {
    fn p(v: &mut [Duration], q: usize) -> Duration {
        v.sort();
        v[(v.len() * q / 100).min(v.len() - 1)]
    }
}

/// `n` lock+unlock pairs on each client, taken in turns (one pair on each client, then
/// the next), so that a slow moment of this shared machine falls on all of them alike.
async fn w1(clients: &[&Client], tag: &str, n: usize) -> Vec<Pairs> {
    let mut out: Vec<Pairs> = clients
        .iter()
        .map(|_| Pairs {
            lock: Vec::with_capacity(n),
            unlock: Vec::with_capacity(n),
            pair: Vec::with_capacity(n),
        })
        .collect();
    for i in 0..n {
        for (c, times) in clients.iter().zip(out.iter_mut()) {
            let lock = c.lock(format!("{{{tag}}}:w1:{}", i % 16));
            let at = Instant::now();
            let g = lock.lock().await.unwrap();
            let locked = at.elapsed();
            g.unlock().await.unwrap();
            let pair = at.elapsed();
            times.lock.push(locked);
            times.unlock.push(pair - locked);
            times.pair.push(pair);
        }
    }
    out
}

/// 8 tasks of `c` take and release one name for `secs`: grants, and the longest wait.
async fn w3(c: &Client, secs: Duration) -> (u64, Duration) {
    let until = Instant::now() + secs;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let lock = c.lock("{w3}:one");
            tokio::spawn(async move {
                let (mut grants, mut longest) = (0u64, Duration::ZERO);
                while Instant::now() < until {
                    let at = Instant::now();
                    let g = lock.lock().await.unwrap();
                    longest = longest.max(at.elapsed());
                    grants += 1;
                    g.unlock().await.unwrap();
                }
                (grants, longest)
            })
        })
        .collect();
    let (mut grants, mut longest) = (0, Duration::ZERO);
    for t in tasks {
        let (g, l) = t.await.unwrap();
        grants += g;
        longest = longest.max(l);
    }
    (grants, longest)
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
        let sc = Client::sentinel(&sentinel.sentinel_urls(), &sentinel.master_name)
            .build()
            .await
            .unwrap();
        let cc = Client::cluster(&cluster.urls()).build().await.unwrap();
        let clients = [&c, &sc, &cc];
        w1(&clients, "warm", 50).await;
        let mut runs = w1(&clients, "w1", n).await;
        let s50 = Pairs::p(&mut runs[0].pair, 50);
        for (name, t) in ["single server", "sentinel, sync on", "cluster, sync on"]
            .iter()
            .zip(runs.iter_mut())
        {
            let (p50, p99) = (Pairs::p(&mut t.pair, 50), Pairs::p(&mut t.pair, 99));
            println!(
                "{name}: W1 pair p50 {p50:?} p99 {p99:?} (lock p50 {:?}, unlock p50 {:?}): {:.2}x of the single server's p50",
                Pairs::p(&mut t.lock, 50),
                Pairs::p(&mut t.unlock, 50),
                p50.as_secs_f64() / s50.as_secs_f64()
            );
        }

        // W3 (8 tasks of one client on one name, no hold): what a contended lock costs
        // through Sentinel and Cluster with sync on, and through Sentinel with sync off.
        let so = Client::sentinel(&sentinel.sentinel_urls(), &sentinel.master_name)
            .replica_sync(redis_rlock::ReplicaSync::Off)
            .build()
            .await
            .unwrap();
        for (name, client) in [
            ("single server", &c),
            ("sentinel, sync on", &sc),
            ("sentinel, sync off", &so),
            ("cluster, sync on", &cc),
        ] {
            let (grants, longest) = w3(client, Duration::from_secs(2)).await;
            println!(
                "{name}: W3 8 tasks one name, {:.0} grants/s, longest wait {longest:?}",
                grants as f64 / 2.0
            );
        }

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
