//! The synchronizer family on the topologies services run: a Sentinel deployment (a
//! master, two replicas, three sentinels, replica sync on by default) and a Redis
//! Cluster (3 masters + 3 replicas, sharded pub/sub). Each synchronizer takes, excludes
//! and wakes a waiter of another client there, and its keys stay in its name's slot.
#![cfg(any(feature = "cluster", feature = "sentinel"))]

mod common;

use std::time::{Duration, Instant};

#[cfg(feature = "cluster")]
use common::topology::ClusterTopology;
#[cfg(feature = "sentinel")]
use common::topology::SentinelTopology;
use redis_rlock::Client;

/// Checks for 200 ms that `waiter` is still blocked (else: `what`), runs `release`, and
/// returns how long after it the waiter got through.
async fn woken_by(
    waiter: tokio::task::JoinHandle<Instant>,
    what: &str,
    release: impl std::future::Future<Output = ()>,
) -> Duration {
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "{what}");
    let released = Instant::now();
    release.await;
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap_or_else(|_| panic!("not woken within 5 s ({what})"))
        .unwrap();
    got.saturating_duration_since(released)
}

/// Runs one round of every synchronizer between two clients: a waiter of `b` is woken
/// by `a`'s release each time, well before any TTL bound (the leases are 30 s).
async fn every_synchronizer_wakes_a_waiter(a: &Client, b: &Client, tag: &str) -> Duration {
    let mut slowest = Duration::ZERO;

    // Fair lock: b waits in the queue, a's unlock tells it on its own channel.
    let name = format!("{{{tag}}}:fair");
    let held = a.fair_lock(name.clone()).lock().await.unwrap();
    let l = b.fair_lock(name.clone());
    let w = tokio::spawn(async move {
        let g = l.lock().await.unwrap();
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    });
    let took = woken_by(w, "a fair lock was held by two clients", async {
        held.unlock().await.unwrap();
    })
    .await;
    slowest = slowest.max(took);

    // Read-write lock: a writer excludes b's reader; its unlock lets the reader in.
    let name = format!("{{{tag}}}:rw");
    let held = a
        .read_write_lock(name.clone())
        .write()
        .lock()
        .await
        .unwrap();
    let rw = b.read_write_lock(name.clone());
    let w = tokio::spawn(async move {
        let g = rw.read().lock().await.unwrap();
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    });
    let took = woken_by(w, "a reader got in beside a writer", async {
        held.unlock().await.unwrap();
    })
    .await;
    slowest = slowest.max(took);

    // Semaphore of one permit.
    let name = format!("{{{tag}}}:sem");
    let sem = a.semaphore(name.clone());
    assert!(sem.try_set_permits(1).await.unwrap());
    sem.acquire(1).await.unwrap();
    let other = b.semaphore(name.clone());
    let w = tokio::spawn(async move {
        other.acquire(1).await.unwrap();
        let at = Instant::now();
        other.release(1).await.unwrap();
        at
    });
    let took = woken_by(w, "a semaphore of 1 gave 2 permits", async {
        sem.release(1).await.unwrap();
    })
    .await;
    slowest = slowest.max(took);

    // Permit-expirable semaphore of one permit, held with a 30 s lease.
    let name = format!("{{{tag}}}:pes");
    let pes = a.permit_expirable_semaphore(name.clone());
    assert!(pes.try_set_permits(1).await.unwrap());
    let p = pes.acquire(Duration::from_secs(30)).await.unwrap();
    let other = b.permit_expirable_semaphore(name.clone());
    let w = tokio::spawn(async move {
        let p = other.acquire(Duration::from_secs(30)).await.unwrap();
        let at = Instant::now();
        other.release(p.id()).await.unwrap();
        at
    });
    let took = woken_by(w, "an expirable permit was taken twice", async {
        pes.release(p.id()).await.unwrap();
    })
    .await;
    slowest = slowest.max(took);

    // Latch of one.
    let name = format!("{tag}:latch");
    let latch = a.count_down_latch(name.clone());
    assert!(latch.try_set_count(1).await.unwrap());
    let other = b.count_down_latch(name.clone());
    let w = tokio::spawn(async move {
        other.wait().await.unwrap();
        Instant::now()
    });
    let took = woken_by(w, "the latch opened early", async {
        latch.count_down().await.unwrap();
    })
    .await;
    slowest = slowest.max(took);
    slowest
}

#[cfg(feature = "sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_family_works_through_sentinel_with_replica_sync() {
    let topo = tokio::task::spawn_blocking(SentinelTopology::start)
        .await
        .unwrap();
    let build = || async {
        Client::sentinel(&topo.sentinel_urls(), &topo.master_name)
            .response_timeout(Duration::from_millis(1500))
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap()
    };
    let (a, b) = (build().await, build().await);
    let master = topo.current_master_port();
    let waits_before = topo
        .nodes()
        .into_iter()
        .find(|n| n.port == master)
        .unwrap()
        .calls("wait");
    let slowest = every_synchronizer_wakes_a_waiter(&a, &b, "sn").await;
    let waits = topo
        .nodes()
        .into_iter()
        .find(|n| n.port == master)
        .unwrap()
        .calls("wait")
        - waits_before;
    println!("FIGURE family_sentinel slowest_wake {slowest:?} wait_calls {waits}");
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
    assert!(waits > 0, "replica sync sent no WAIT");
}

#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_family_works_on_a_cluster_in_its_names_slot() {
    let topo = tokio::task::spawn_blocking(ClusterTopology::start)
        .await
        .unwrap();
    let build = || async {
        Client::cluster(&topo.urls())
            .response_timeout(Duration::from_millis(1500))
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap()
    };
    let (a, b) = (build().await, build().await);
    let mut slowest = Duration::ZERO;
    // Tags that land on different masters.
    for tag in ["c1", "c2", "c3"] {
        slowest = slowest.max(every_synchronizer_wakes_a_waiter(&a, &b, tag).await);
    }
    // Every key a synchronizer left (a fair lock's queue, a read-write lock's marks,
    // a semaphore's timeout set...) is in its name's slot.
    for tag in ["c1", "c2", "c3"] {
        let slot = topo.keyslot(&format!("{{{tag}}}"));
        let node = topo.master_of_slot(slot);
        let keys: Vec<String> = common::raw_cmd(
            &format!("redis://127.0.0.1:{node}"),
            &["KEYS", &format!("*{tag}*")],
        )
        .unwrap();
        for k in keys {
            assert_eq!(topo.keyslot(&k), slot, "{k} is outside its name's slot");
        }
    }
    println!("FIGURE family_cluster slowest_wake {slowest:?}");
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
}
