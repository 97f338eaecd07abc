//! Redis Sentinel: 1 master + 2 replicas + 3 sentinels on loopback. Locks, waiters and
//! the watchdog across SENTINEL FAILOVER and kill -9 of the master, and replica sync.
//!
//! Measured figures are printed as `FIGURE <name> <value>` lines (`--nocapture`).
#![cfg(feature = "sentinel")]

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
    assert!(
        wait_calls(m) >= before + 4,
        "WAIT was not sent after writes"
    );

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

    // A grant waits for a replica; an unlock does not (it would only wait longer for
    // an answer nothing acts on).
    let before = wait_calls(m);
    let l = c.lock("sn:pairs");
    for _ in 0..5 {
        let g = l
            .try_lock_for(Duration::ZERO, Some(Duration::from_secs(10)))
            .await
            .unwrap()
            .expect("free");
        g.unlock().await.unwrap();
    }
    assert_eq!(
        wait_calls(m) - before,
        5,
        "one WAIT per grant and none per unlock"
    );

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
    assert_eq!(
        m.cmd::<i64>(&["EXISTS", "sn:unsynced"]),
        0,
        "not rolled back"
    );
    // With the replicas back, the same lock is granted.
    let g = c.lock("sn:unsynced").try_lock().await.unwrap().unwrap();
    g.unlock().await.unwrap();

    // A hand-over is a grant too: one that no replica acknowledged is undone, and the
    // waiter it was meant for goes on waiting (its own attempts are rolled back the same
    // way) until a grant reaches a replica.
    let g = c
        .lock("sn:handover")
        .try_lock_for(Duration::ZERO, Some(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("free");
    let waiter = tokio::spawn({
        let l = c.lock("sn:handover");
        async move { l.try_lock_for(Duration::from_secs(20), None).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    for r in &topo.replicas {
        r.signal("STOP");
    }
    g.unlock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let served_unsynced = waiter.is_finished();
    for r in &topo.replicas {
        r.signal("CONT");
    }
    assert!(
        !served_unsynced,
        "the waiter was served while no replica acknowledged"
    );
    let g = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("served once the replicas are back")
        .unwrap()
        .unwrap()
        .expect("granted");
    let copies: i64 = topo
        .nodes()
        .into_iter()
        .map(|n| n.cmd::<i64>(&["EXISTS", "sn:handover"]))
        .sum();
    assert!(copies >= 2, "the grant reached no replica");
    g.unlock().await.unwrap();

    // With replicas that answer, the release goes straight to the waiter.
    let g = c.lock("sn:handover").lock().await.unwrap();
    let waiter = tokio::spawn({
        let l = c.lock("sn:handover");
        async move { l.lock().await.unwrap().unlock().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = c.stats().handovers;
    g.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("served")
        .unwrap();
    assert_eq!(c.stats().handovers, before + 1, "not handed over");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synced_calls_do_not_queue_behind_each_others_wait() {
    let topo = tokio::task::spawn_blocking(SentinelTopology::start)
        .await
        .unwrap();
    let wait = Duration::from_millis(600);
    let sync = ReplicaSync::Wait {
        timeout: wait,
        acks: 1,
        on_failure: SyncFailure::Fail,
    };
    let c = client(&topo, Duration::from_millis(3000), Some(sync)).await;
    // Warm: the lanes exist before the replicas stop.
    for i in 0..4 {
        let g = c.lock(format!("sn:lane{i}")).lock().await.unwrap();
        g.unlock().await.unwrap();
    }
    for r in &topo.replicas {
        r.signal("STOP");
    }
    // One call alone: its WAIT (and the rollback's) run out.
    let alone_at = Instant::now();
    let alone = c.lock("sn:alone").try_lock().await;
    let alone_took = alone_at.elapsed();
    assert!(
        matches!(alone, Err(redis_rlock::Error::NotReplicated { .. })),
        "{alone:?}"
    );
    let started = Instant::now();
    let calls: Vec<_> = (0..4)
        .map(|i| {
            let lock = c.lock(format!("sn:lane{i}"));
            tokio::spawn(async move { lock.try_lock().await.map(|g| g.is_some()) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let probe_at = Instant::now();
    let locked = c.lock("sn:lane0").is_locked().await;
    let probe = probe_at.elapsed();
    let mut outcomes = Vec::new();
    for call in calls {
        outcomes.push(call.await.unwrap());
    }
    let all = started.elapsed();
    for r in &topo.replicas {
        r.signal("CONT");
    }
    figure(
        "one_synced_call_with_replicas_paused_ms",
        alone_took.as_millis(),
    );
    figure("four_synced_calls_with_replicas_paused_ms", all.as_millis());
    figure("unsynced_query_meanwhile_ms", probe.as_millis());
    assert!(locked.is_ok(), "{locked:?}");
    for o in &outcomes {
        assert!(
            matches!(o, Err(redis_rlock::Error::NotReplicated { .. })),
            "{o:?}"
        );
    }
    // One after another they would take four times as long as one.
    assert!(
        all < alone_took * 3 / 2 + Duration::from_millis(100),
        "synced calls queued: {all:?} for four, {alone_took:?} for one"
    );
    assert!(
        probe < wait / 2,
        "a plain query waited behind WAIT: {probe:?}"
    );
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
        let tasks = common::spawn_overlap_waiters(
            6,
            2,
            || waiters.lock(&name),
            &referee.url(),
            &format!("sf{round}"),
            &served,
        );
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

/// The danger case of issue #4: the master fails over before a lock it granted reached
/// any replica. Replication (and only replication) runs through proxies, one per node:
/// every node announces its proxy's port, the sentinels monitor proxy addresses, and the
/// clients map those back to the real ports. A trial black-holes the current master's
/// proxy (its replicas stop receiving), lets client A take a lock, forces SENTINEL
/// FAILOVER, and lets client B try the same lock on the new master. A double grant is A
/// and B both holding it. Trials: `RLOCK_FAILOVER_TRIALS` per mode (default 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_grant_rate_at_failover_with_replica_sync_on_and_off() {
    use common::proxy::Proxy;
    use common::topology::SentinelProc;

    let trials: usize = std::env::var("RLOCK_FAILOVER_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let nodes: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]))
        .collect();
    let mut proxies = Vec::new();
    for n in &nodes {
        proxies.push(Proxy::start(n.port).await);
    }
    for (n, p) in nodes.iter().zip(&proxies) {
        let _: String = n.cmd(&["CONFIG", "SET", "replica-announce-ip", "127.0.0.1"]);
        let _: String = n.cmd(&[
            "CONFIG",
            "SET",
            "replica-announce-port",
            &p.port.to_string(),
        ]);
    }
    for n in &nodes[1..] {
        let _: String = n.cmd(&["REPLICAOF", "127.0.0.1", &proxies[0].port.to_string()]);
    }
    let online = |n: &RedisServer| {
        n.try_cmd::<String>(&["INFO", "replication"])
            .map(|i| i.matches("state=online").count())
            .unwrap_or(0)
    };
    assert!(common::eventually(Duration::from_secs(20), || online(&nodes[0]) == 2).await);
    let sentinels: Vec<SentinelProc> = (0..3)
        .map(|i| {
            SentinelProc::start(
                nodes[0].dir.join(format!("dg-sentinel-{i}")),
                "mymaster",
                proxies[0].port,
            )
        })
        .collect();
    // Only the test's SENTINEL FAILOVER fails the master over. With the harness's 1 s
    // down-after, the other sentinels also start a failover of the black-holed master a
    // second into the forced one, promote another replica, and can leave the group split
    // or back on the black-holed master, refusing every further FAILOVER (CI, on Valkey).
    for s in &sentinels {
        let _: String = s.cmd(&[
            "SENTINEL",
            "SET",
            "mymaster",
            "down-after-milliseconds",
            "60000",
        ]);
    }
    assert!(
        common::eventually(Duration::from_secs(30), || sentinels
            .iter()
            .all(|s| s.sees("mymaster", 2, 2)))
        .await
    );
    let urls: Vec<String> = sentinels.iter().map(|s| s.url()).collect();
    let build = |sync: ReplicaSync| {
        let mut b = Client::sentinel(&urls, "mymaster")
            .response_timeout(Duration::from_millis(1500))
            .connect_timeout(Duration::from_millis(500))
            .replica_sync(sync);
        for (n, p) in nodes.iter().zip(&proxies) {
            b = b.map_address(("127.0.0.1", p.port), ("127.0.0.1", n.port));
        }
        b.build()
    };
    let master_proxy = || {
        sentinels
            .iter()
            .find_map(|s| s.master_port("mymaster"))
            .unwrap()
    };

    for sync_on in [false, true] {
        let sync = if sync_on {
            ReplicaSync::Wait {
                timeout: Duration::from_millis(300),
                acks: 1,
                on_failure: SyncFailure::Fail,
            }
        } else {
            ReplicaSync::Off
        };
        let a = build(sync.clone()).await.unwrap();
        let b = build(sync).await.unwrap();
        let (mut doubles, mut a_grants, mut recover_ms) = (0, 0, Vec::new());
        for t in 0..trials {
            let name = format!("dg:{sync_on}:{t}");
            // Sentinels pick only replicas they have fresh INFO about. They must also agree
            // on the master, and it must serve both replicas: the heal of the last trial can
            // leave one sentinel a failover behind the others (they fail over on their own
            // while a master is black-holed), and black-holing the master it names would
            // then cut a replica off instead.
            let settled = || {
                let ports: Vec<Option<u16>> = sentinels
                    .iter()
                    .map(|s| s.master_port("mymaster"))
                    .collect();
                let Some(p) = ports[0] else { return false };
                let Some(i) = proxies.iter().position(|x| x.port == p) else {
                    return false;
                };
                ports.iter().all(|q| *q == Some(p))
                    && online(&nodes[i]) == 2
                    && sentinels.iter().all(|s| s.sees("mymaster", 2, 2))
            };
            assert!(
                common::eventually(Duration::from_secs(30), settled).await,
                "sentinels did not settle on one master with 2 replicas"
            );
            let old = master_proxy();
            let idx = proxies.iter().position(|p| p.port == old).unwrap();
            proxies[idx].set_blackhole(true);
            let a_guard = match a
                .lock(name.as_str())
                .try_lock_for(Duration::ZERO, Some(Duration::from_secs(30)))
                .await
            {
                Ok(g) => g,
                Err(redis_rlock::Error::NotReplicated { .. }) => None,
                // Still talking to the master the last trial's failover demoted (a
                // READONLY reply): no grant, and a transient error, as documented.
                Err(e) if e.is_transient() => None,
                Err(e) => panic!("A: {e}"),
            };
            a_grants += a_guard.is_some() as usize;
            // A sentinel refuses (INPROG) until it has finished the previous failover, and
            // may abort one when it finds no good replica: ask again then.
            let started = Instant::now();
            let mut switched = false;
            for _ in 0..4 {
                let mut refusal = String::new();
                let asked = common::eventually(Duration::from_secs(20), || {
                    match sentinels[0].try_cmd::<String>(&["SENTINEL", "FAILOVER", "mymaster"]) {
                        Ok(_) => true,
                        Err(e) => {
                            refusal = e.to_string();
                            false
                        }
                    }
                });
                let asked = asked.await;
                assert!(asked, "SENTINEL FAILOVER refused for 20 s: {refusal}");
                switched = common::eventually(Duration::from_secs(8), || {
                    let p = master_proxy();
                    p != old
                        && sentinels
                            .iter()
                            .all(|s| s.master_port("mymaster") == Some(p))
                })
                .await;
                if switched {
                    break;
                }
            }
            assert!(switched, "no failover");
            // B retries like a service would, through errors, for up to 8 s.
            let mut b_guard = Ok(None);
            while started.elapsed() < Duration::from_secs(8) {
                b_guard = b
                    .lock(name.as_str())
                    .try_lock_for(Duration::from_secs(1), Some(Duration::from_secs(30)))
                    .await;
                match &b_guard {
                    Ok(Some(_)) => break,
                    Err(e) if !e.is_transient() => panic!("B: {e}"),
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            if let Ok(Some(_)) = &b_guard {
                recover_ms.push(started.elapsed().as_millis());
            }
            if a_guard.is_some() && matches!(b_guard, Ok(Some(_))) {
                doubles += 1;
            }
            // Heal: the old master gets the sentinels' REPLICAOF and resyncs.
            proxies[idx].set_blackhole(false);
            let healing = Instant::now();
            let new = master_proxy();
            let new_idx = proxies.iter().position(|p| p.port == new).unwrap();
            // What the sentinels would send at their next 10 s INFO poll, sent now.
            let _: String = nodes[idx].cmd(&["REPLICAOF", "127.0.0.1", &new.to_string()]);
            assert!(
                common::eventually(Duration::from_secs(30), || online(&nodes[new_idx]) == 2).await,
                "topology did not heal"
            );
            eprintln!(
                "trial {t} sync {sync_on}: healed in {:?}",
                healing.elapsed()
            );
            drop(a_guard);
            if let Ok(Some(g)) = b_guard {
                let _ = g.unlock().await;
            }
        }
        let mode = if sync_on { "on" } else { "off" };
        figure(
            &format!("double_grants_sync_{mode}"),
            format!("{doubles}/{trials}"),
        );
        figure(
            &format!("a_granted_sync_{mode}"),
            format!("{a_grants}/{trials}"),
        );
        figure(
            &format!("b_granted_after_failover_ms_sync_{mode}"),
            &recover_ms,
        );
        if sync_on {
            assert_eq!(doubles, 0, "double grant with replica sync on");
        } else {
            assert!(doubles >= 1, "the scenario did not reproduce the danger");
        }
    }
}
