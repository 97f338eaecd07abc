//! Redis Cluster: 3 masters + 3 replicas on loopback. Locks spread over the slots,
//! sharded pub/sub waiters, slot-grouped renewals, and CLUSTER FAILOVER and kill -9 of a
//! master while locks are held and waiters wait; churn over sharded pub/sub.
//!
//! Measured figures are printed as `FIGURE <name> <value>` lines (`--nocapture`).
#![cfg(feature = "cluster")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::topology::ClusterTopology;
use common::{Overlap, RedisServer, Steps};
use redis_rlock::{Client, Error, ReplicaSync};

fn figure(name: &str, value: impl std::fmt::Debug) {
    println!("FIGURE {name} {value:?}");
}

async fn client(topo: &ClusterTopology, wd: Duration) -> Client {
    Client::cluster(&topo.urls())
        .watchdog_timeout(wd)
        .response_timeout(Duration::from_millis(1500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap()
}

fn owner_has(topo: &ClusterTopology, key: &str) -> bool {
    let port = topo.master_of_slot(topo.keyslot(key));
    let node = topo.nodes.iter().find(|n| n.port == port).unwrap();
    node.try_cmd::<i64>(&["EXISTS", key]).unwrap_or(0) == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_locks_over_all_masters_with_sharded_waiters_and_slot_grouped_renewals() {
    common::init_tracing();
    let steps = Steps::new("spread");
    let topo = tokio::task::spawn_blocking(ClusterTopology::start)
        .await
        .unwrap();
    steps.mark("cluster ready");
    let a = client(&topo, Duration::from_millis(900)).await;
    let b = client(&topo, Duration::from_millis(900)).await;

    // Names over many slots (and so all three masters), plus a name with a hash tag.
    let mut names: Vec<String> = (0..48).map(|i| format!("cl:{i}")).collect();
    names.push("{user7}:cart".into());
    let masters: std::collections::HashSet<u16> = names
        .iter()
        .map(|n| topo.master_of_slot(topo.keyslot(n)))
        .collect();
    assert_eq!(masters.len(), 3, "names should cover every master");
    steps.mark("clients connected");

    let mut guards = Vec::new();
    for n in &names {
        let g = a.lock(n.as_str()).lock().await.unwrap();
        // Re-entry works on a cluster too.
        let again = a.lock(n.as_str()).lock().await.unwrap();
        again.unlock().await.unwrap();
        assert!(owner_has(&topo, n), "{n} not at its slot owner");
        guards.push(g);
    }
    steps.mark("49 locks taken");
    // Renewed in per-slot batches past three leases.
    tokio::time::sleep(Duration::from_millis(2700)).await;
    assert!(guards.iter().all(|g| !g.is_lost()), "a lock was lost");
    assert!(names.iter().all(|n| owner_has(&topo, n)));
    steps.mark("renewed past three leases");

    // A waiter per lock in the other client, subscribed with SSUBSCRIBE at the owner.
    let served = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for n in &names {
        let (l, served) = (b.lock(n.as_str()), served.clone());
        tasks.push(tokio::spawn(async move {
            let g = l
                .try_lock_for(Duration::from_secs(20), None)
                .await
                .unwrap()
                .expect("served");
            served.fetch_add(1, Ordering::SeqCst);
            g.unlock().await.unwrap();
        }));
    }
    let probe = redis_rlock::protocol::channel_name(&names[0]);
    let owner = topo.master_of_slot(topo.keyslot(&names[0]));
    let node = topo.nodes.iter().find(|n| n.port == owner).unwrap();
    let subscribed = common::eventually(Duration::from_secs(5), || {
        let v: Vec<redis::Value> = node.cmd(&["PUBSUB", "SHARDNUMSUB", &probe]);
        matches!(v.get(1), Some(redis::Value::Int(1)))
    })
    .await;
    assert!(subscribed, "no sharded subscription at the slot owner");
    steps.mark("waiters subscribed");
    let started = Instant::now();
    common::release_and_join(guards, tasks).await;
    steps.mark("waiters served");
    assert_eq!(served.load(Ordering::SeqCst), names.len());
    figure(
        "cluster_49_waiters_served_ms",
        started.elapsed().as_millis(),
    );

    // A name whose auxiliary keys cannot share its slot is refused with a typed error.
    assert!(matches!(
        a.lock("{}x").try_lock().await,
        Err(Error::NameNotClusterSafe { .. })
    ));
    assert!(matches!(a.lock("").try_lock().await, Err(Error::EmptyName)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_and_master_kill_keep_holders_and_serve_waiters() {
    common::init_tracing();
    let steps = Steps::new("failover");
    let mut topo = tokio::task::spawn_blocking(ClusterTopology::start)
        .await
        .unwrap();
    steps.mark("cluster ready");
    let referee = RedisServer::start();
    let holder = client(&topo, Duration::from_secs(8)).await;
    let waiters = client(&topo, Duration::from_secs(8)).await;
    steps.mark("clients connected");

    for (round, how) in ["failover", "kill"].into_iter().enumerate() {
        let name = format!("cf:{how}");
        let slot = topo.keyslot(&name);
        let g = holder.lock(&name).lock().await.unwrap();
        steps.mark(format_args!("{how}: {name} (slot {slot}) held"));
        let served = Arc::new(AtomicUsize::new(0));
        let tasks = common::spawn_overlap_waiters(
            6,
            2,
            || waiters.lock(&name),
            &referee.url(),
            &format!("cf{round}"),
            &served,
        );
        tokio::time::sleep(Duration::from_millis(300)).await;

        let old = topo.master_of_slot(slot);
        steps.mark(format_args!("{how}: waiters started; slot owner :{old}"));
        let started = Instant::now();
        let new = if how == "failover" {
            let t = &topo;
            tokio::task::block_in_place(|| t.failover_slot(slot))
        } else {
            topo.node_by_port(old).kill();
            let t = &topo;
            tokio::task::block_in_place(|| t.wait_slot_moved(slot, old, Duration::from_secs(20)))
        };
        assert_ne!(new, old);
        let promoted = started.elapsed();
        steps.mark(format_args!("{how}: :{new} serves the slot"));
        // The client follows: a probe lock in the same slot is taken at the new owner.
        let probe = format!("{{{name}}}:probe");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut recovered = false;
        while Instant::now() < deadline {
            if let Ok(Some(p)) = holder.lock(probe.as_str()).try_lock().await {
                p.unlock().await.unwrap();
                recovered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(recovered, "client did not follow the {how}");
        steps.mark(format_args!("{how}: probe lock taken at the new owner"));
        // The waiters' subscription follows the slot to the node that publishes its
        // unlocks. Redis 7 also accepts SSUBSCRIBE at a replica of the owner, such as
        // the demoted master, but the owner forwards messages only to the replicas it
        // knows of, which it learns by gossip: unlocks published before that are lost.
        let channel = redis_rlock::protocol::channel_name(&name);
        let new_owner = topo.nodes.iter().find(|n| n.port == new).unwrap();
        let moved = common::eventually(Duration::from_secs(5), || {
            let v: Vec<redis::Value> = new_owner.cmd(&["PUBSUB", "SHARDNUMSUB", &channel]);
            matches!(v.get(1), Some(redis::Value::Int(n)) if *n >= 1)
        })
        .await;
        let subscribers = {
            let t = &topo;
            tokio::task::block_in_place(|| t.shard_subscribers(&channel))
        };
        steps.mark(format_args!(
            "{how}: subscribers of the lock's channel {subscribers}"
        ));
        assert!(
            moved,
            "after the {how} the waiters are not subscribed at the new owner :{new}: {subscribers}"
        );
        figure(&format!("cluster_{how}_promoted_ms"), promoted.as_millis());
        figure(
            &format!("cluster_{how}_client_recovered_ms"),
            started.elapsed().as_millis(),
        );

        assert!(owner_has(&topo, &name), "lock lost at {how}");
        assert!(!g.is_lost());
        assert_eq!(served.load(Ordering::SeqCst), 0, "a waiter got a held lock");
        g.unlock().await.unwrap();
        steps.mark(format_args!("{how}: unlocked; waiting for the waiters"));
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(40), t)
                .await
                .expect("waiters served after failover")
                .unwrap();
        }
        assert_eq!(served.load(Ordering::SeqCst), 12);
        assert_eq!(Overlap::report(&referee, &format!("cf{round}")).0, 0);
        steps.mark(format_args!("{how}: 12 holds served"));
    }
}

/// Contention over sharded pub/sub, replica sync off: under churn of several clients on
/// one name nobody overlaps, and no hold is left at the slot's master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_churn_leaves_no_hold() {
    common::init_tracing();
    let topo = tokio::task::spawn_blocking(ClusterTopology::start)
        .await
        .unwrap();
    let connect = || async {
        Client::cluster(&topo.urls())
            .replica_sync(ReplicaSync::Off)
            .response_timeout(Duration::from_millis(1500))
            .build()
            .await
            .unwrap()
    };
    let (a, b, c) = (connect().await, connect().await, connect().await);
    let name = "cl:churn";
    let owner = topo.master_of_slot(topo.keyslot(name));
    let node = topo.nodes.iter().find(|n| n.port == owner).unwrap();
    // Churn: 3 clients x 2 tasks, waits of 1-19 ms, some given up.
    let (acquired, gave_up) = common::churn(&[&a, &b, &c], name, Duration::from_secs(2)).await;
    figure("cluster_churn_acquired", acquired);
    figure("cluster_churn_gave_up", gave_up);
    assert!(acquired > 50);
    assert!(gave_up > 0, "no waiter gave up");
    // Give-backs run in the background: a moment, far below a lease.
    let gone = common::eventually(Duration::from_secs(3), || {
        node.try_cmd::<i64>(&["EXISTS", name]).unwrap_or(1) == 0
    })
    .await;
    let left: Vec<String> = node.cmd(&["HGETALL", name]);
    assert!(gone, "a hold nobody uses is left: {left:?}");
}
