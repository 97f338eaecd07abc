//! Smoke test of the topology harness: both topologies come up and fail over.
//! Prints `FIGURE <name> <ms>` lines with `--nocapture`.

mod common;

use std::time::Instant;

use common::topology::{ClusterTopology, SentinelTopology};

fn figure(name: &str, since: Instant) {
    println!("FIGURE {name} {}", since.elapsed().as_millis());
}

#[test]
fn sentinel_topology_starts_and_fails_over() {
    let t = Instant::now();
    let topo = SentinelTopology::start();
    figure("sentinel_ready_ms", t);
    let old = topo.current_master_port();
    assert_eq!(old, topo.master.port);
    let t = Instant::now();
    let new = topo.failover();
    figure("sentinel_failover_ms", t);
    assert_ne!(new, old);
}

#[test]
fn cluster_topology_starts_and_fails_over() {
    let t = Instant::now();
    let topo = ClusterTopology::start();
    figure("cluster_ready_ms", t);
    let slot = topo.keyslot("lock:smoke");
    let old = topo.master_of_slot(slot);
    let owner = topo.nodes.iter().find(|n| n.port == old).unwrap();
    let _: String = owner.cmd(&["SET", "lock:smoke", "1"]);
    let t = Instant::now();
    let new = topo.failover_slot(slot);
    figure("cluster_failover_ms", t);
    assert_ne!(new, old);
    assert_eq!(topo.master_of_slot(slot), new);
    let owner = topo.nodes.iter().find(|n| n.port == new).unwrap();
    let v: String = owner.cmd(&["GET", "lock:smoke"]);
    assert_eq!(v, "1");
}
