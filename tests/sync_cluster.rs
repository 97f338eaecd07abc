//! The semaphores and the latch on a Redis Cluster (3 masters + 3 replicas): every key
//! and channel of one in its name's slot, waiters woken through sharded pub/sub at the
//! slot's owner, and a latch name whose Redisson channel would land in another slot
//! refused before anything is sent.
#![cfg(feature = "cluster")]

mod common;

use std::time::{Duration, Instant};

use common::topology::ClusterTopology;
use redis_rlock::{Client, Error};

async fn client(topo: &ClusterTopology) -> Client {
    Client::cluster(&topo.urls())
        .response_timeout(Duration::from_millis(1500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronizers_wake_their_waiters_on_a_cluster() {
    let topo = tokio::task::spawn_blocking(ClusterTopology::start)
        .await
        .unwrap();
    let a = client(&topo).await;
    let b = client(&topo).await;

    // Names spread over the masters, one with a hash tag.
    for name in ["cs:sem:1", "cs:sem:2", "cs:sem:3", "{cs7}:sem"] {
        let sem = a.semaphore(name);
        assert!(sem.try_set_permits(0).await.unwrap());
        let waiter = {
            let sem = b.semaphore(name);
            tokio::spawn(async move {
                let t = Instant::now();
                (
                    sem.try_acquire_for(1, Duration::from_secs(10)).await,
                    t.elapsed(),
                )
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        sem.release(1).await.unwrap();
        let (got, took) = tokio::time::timeout(Duration::from_secs(15), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(got.unwrap(), "{name}: waiter got nothing");
        assert!(took < Duration::from_secs(5), "{name}: woken late {took:?}");
    }

    let pes = a.permit_expirable_semaphore("{cs7}:seats");
    pes.try_set_permits(1).await.unwrap();
    let p = pes.acquire(Duration::from_millis(500)).await.unwrap();
    let t = Instant::now();
    let next = b
        .permit_expirable_semaphore("{cs7}:seats")
        .try_acquire(Duration::from_secs(5), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(next.is_some() && t.elapsed() < Duration::from_secs(2));
    assert!(
        !pes.try_release(p.id()).await.unwrap(),
        "an ended lease released live"
    );

    let latch = a.count_down_latch("cs:latch");
    latch.try_set_count(1).await.unwrap();
    let waiter = {
        let l = b.count_down_latch("cs:latch");
        tokio::spawn(async move { l.wait_for(Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    latch.count_down().await.unwrap();
    let zero = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(zero.unwrap());
    // Redisson's latch channel adds braces around a tagged name: another slot.
    assert!(matches!(
        a.count_down_latch("{cs7}:latch").try_set_count(1).await,
        Err(Error::NameNotClusterSafe { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watched_permits_on_several_masters_outlive_their_leases() {
    let topo = tokio::task::spawn_blocking(ClusterTopology::start)
        .await
        .unwrap();
    let a = Client::cluster(&topo.urls())
        .watchdog_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_millis(1500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let b = client(&topo).await;
    // Names in several slots: each semaphore's renewals go to its own slot.
    let names = ["cs:pes:1", "cs:pes:2", "cs:pes:3", "{cs7}:pes"];
    let mut guards = Vec::new();
    for name in names {
        let pes = a.permit_expirable_semaphore(name);
        assert!(pes.try_set_permits(2).await.unwrap());
        guards.push(pes.acquire_permit().await.unwrap());
        guards.push(pes.acquire_permit().await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(3500)).await;
    for (name, pair) in names.iter().zip(guards.chunks(2)) {
        assert!(pair.iter().all(|g| !g.is_lost()), "{name}: lost");
        let other = b.permit_expirable_semaphore(*name);
        let got = other
            .try_acquire(Duration::from_secs(5), Duration::ZERO)
            .await
            .unwrap();
        assert!(
            got.is_none(),
            "{name}: another client took a watched permit"
        );
    }
    drop(guards);
    for name in names {
        let other = b.permit_expirable_semaphore(name);
        let got = other
            .try_acquire(Duration::from_secs(5), Duration::from_secs(5))
            .await;
        assert!(
            got.unwrap().is_some(),
            "{name}: the dropped guards gave nothing back"
        );
    }
}
