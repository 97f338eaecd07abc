//! Redis Sentinel: 1 master + 2 replicas + 3 sentinels on loopback. Locks, waiters and
//! the watchdog across SENTINEL FAILOVER and kill -9 of the master, and replica sync.
//!
//! Measured figures are printed as `FIGURE <name> <value>` lines (`--nocapture`).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::topology::SentinelTopology;
use common::{Overlap, RedisServer};
use redis_rlock::{Client, ReplicaSync, SyncFailure};

fn figure(name: &str, value: impl std::fmt::Debug) {
    println!("FIGURE {name} {value:?}");
}

async fn client(topo: &SentinelTopology, wd: Duration, sync: Option<ReplicaSync>) -> Client {
    let mut b = Client::sentinel(&topo.sentinel_urls(), &topo.master_name)
        .watchdog_timeout(wd)
        .response_timeout(Duration::from_millis(1500))
        .connect_timeout(Duration::from_millis(500));
    if let Some(s) = sync {
        b = b.replica_sync(s);
    }
    b.build().await.unwrap()
}

fn wait_calls(server: &RedisServer) -> u64 {
    server.calls("wait")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_locks_wait_for_a_replica_and_the_off_switch_sends_no_wait() {
    let topo = tokio::task::spawn_blocking(SentinelTopology::start)
        .await
        .unwrap();
    let master = topo.current_master_port();
    let c = client(&topo, Duration::from_millis(900), None).await;

    // Lock, re-enter, unlock; every write was followed by WAIT on the master.
    let before = wait_calls(topo.nodes().into_iter().find(|n| n.port == master).unwrap());
    let lock = c.lock("sn:a");
    let g = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    // Renewed by the watchdog past three leases, and the replicas have the lock too.
    tokio::time::sleep(Duration::from_millis(2700)).await;
    assert!(!g.is_lost());
    for node in topo.nodes() {
        let exists: i64 = node.cmd(&["EXISTS", "sn:a"]);
        assert_eq!(exists, 1, "node {} lacks the lock", node.port);
    }
    inner.unlock().await.unwrap();
    g.unlock().await.unwrap();
    let m = topo.nodes().into_iter().find(|n| n.port == master).unwrap();
    assert!(wait_calls(m) >= before + 4, "WAIT was not sent after writes");

    // A waiter in another client is woken by the unlock message.
    let other = client(&topo, Duration::from_millis(900), None).await;
    let g = lock.lock().await.unwrap();
    let waiter = tokio::spawn({
        let l = other.lock("sn:a");
        async move {
            let g = l
                .try_lock_for(Duration::from_secs(10), None)
                .await
                .unwrap()
                .expect("served");
            g.unlock().await.unwrap();
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    g.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("waiter served")
        .unwrap();

    // The off switch: no WAIT at all.
    let off = client(&topo, Duration::from_millis(900), Some(ReplicaSync::Off)).await;
    let before = wait_calls(m);
    let l = off.lock("sn:off");
    for _ in 0..5 {
        l.lock().await.unwrap().unlock().await.unwrap();
    }
    assert_eq!(wait_calls(m), before, "ReplicaSync::Off still sent WAIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_unsynced_acquisition_is_rolled_back() {
    let topo = tokio::task::spawn_blocking(SentinelTopology::start)
        .await
        .unwrap();
    let fail_fast = ReplicaSync::Wait {
        timeout: Duration::from_millis(200),
        acks: 1,
        on_failure: SyncFailure::Fail,
    };
    let c = client(&topo, Duration::from_millis(3000), Some(fail_fast)).await;
    for r in &topo.replicas {
        r.signal("STOP");
    }
    let got = c.lock("sn:unsynced").try_lock().await;
    for r in &topo.replicas {
        r.signal("CONT");
    }
    assert!(
        matches!(got, Err(redis_rlock::Error::NotReplicated { .. })),
        "{got:?}"
    );
    let master = topo.current_master_port();
    let m = topo.nodes().into_iter().find(|n| n.port == master).unwrap();
    assert_eq!(m.cmd::<i64>(&["EXISTS", "sn:unsynced"]), 0, "not rolled back");
    // With the replicas back, the same lock is granted.
    let g = c.lock("sn:unsynced").try_lock().await.unwrap().unwrap();
    g.unlock().await.unwrap();
}

/// Waits until `probe` can be taken through `c` and the key shows up on node `port`.
async fn recovered_on(c: &Client, topo: &SentinelTopology, port: u16, probe: &str) -> bool {
    let node = topo.nodes().into_iter().find(|n| n.port == port).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(g)) = c.lock(probe).try_lock().await {
            let there = node.try_cmd::<i64>(&["EXISTS", probe]).unwrap_or(0) == 1;
            g.unlock().await.unwrap();
            if there {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_and_master_kill_keep_holders_and_serve_waiters() {
    let mut topo = tokio::task::spawn_blocking(SentinelTopology::start)
        .await
        .unwrap();
    let referee = RedisServer::start();
    let holder = client(&topo, Duration::from_secs(8), None).await;
    let waiters = client(&topo, Duration::from_secs(8), None).await;

    for (round, how) in ["failover", "kill"].into_iter().enumerate() {
        let name = format!("sf:{how}");
        let g = holder.lock(&name).lock().await.unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..6 {
            let l = waiters.lock(&name);
            let (url, served) = (referee.url(), served.clone());
            let tag = format!("sf{round}");
            tasks.push(tokio::spawn(async move {
                let mut overlap = Overlap::new(&url, &tag).await;
                for k in 0..2 {
                    let g = l
                        .try_lock_for(Duration::from_secs(40), None)
                        .await
                        .unwrap_or_else(|e| panic!("waiter {i} round {k}: {e}"))
                        .expect("waiter served in time");
                    assert!(overlap.enter(g.fencing_token()).await);
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    overlap.leave().await;
                    g.unlock().await.unwrap();
                    served.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(served.load(Ordering::SeqCst), 0);

        let old = topo.current_master_port();
        let started = Instant::now();
        let new = if how == "failover" {
            let t = &topo;
            tokio::task::block_in_place(|| t.failover())
        } else {
            topo.node_by_port(old).kill();
            let t = &topo;
            tokio::task::block_in_place(|| t.wait_new_master(old, Duration::from_secs(20)))
        };
        assert_ne!(new, old);
        let promoted = started.elapsed();
        assert!(recovered_on(&holder, &topo, new, &format!("probe:{how}")).await);
        figure(&format!("sentinel_{how}_promoted_ms"), promoted.as_millis());
        figure(
            &format!("sentinel_{how}_client_recovered_ms"),
            started.elapsed().as_millis(),
        );

        // The lock reached a replica before it was granted, so the new master has it.
        let node = topo.nodes().into_iter().find(|n| n.port == new).unwrap();
        assert_eq!(node.cmd::<i64>(&["EXISTS", &name]), 1, "lock lost at {how}");
        assert!(!g.is_lost());
        assert_eq!(served.load(Ordering::SeqCst), 0, "a waiter got a held lock");
        g.unlock().await.unwrap();
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(40), t)
                .await
                .expect("waiters served after failover")
                .unwrap();
        }
        assert_eq!(served.load(Ordering::SeqCst), 12);
        assert_eq!(Overlap::report(&referee, &format!("sf{round}")).0, 0);
    }
}
