//! Forms a Redis Cluster out of fresh cluster-enabled nodes with plain commands sent
//! through the redis crate, so that the tests need no `redis-cli --cluster create`:
//! distinct config epochs, `CLUSTER ADDSLOTSRANGE` for the masters, `CLUSTER MEET`, and
//! `CLUSTER REPLICATE` for the replicas. Works for Redis 7 and Valkey, over plain TCP
//! or TLS (the caller opens the connections). Every wait is bounded and panics with
//! what it was waiting for.

use std::time::{Duration, Instant};

/// Slots of a Redis Cluster.
const SLOTS: u32 = 16384;

/// How long the nodes may take to learn of each other, and a replica of its master.
const FORM_LIMIT: Duration = Duration::from_secs(30);

/// One node to put in the cluster: its client port and its cluster bus port.
#[derive(Clone, Copy, Debug)]
pub struct ClusterNode {
    pub port: u16,
    pub bus_port: u16,
}

fn query<T: redis::FromRedisValue>(
    conn: &mut redis::Connection,
    args: &[&str],
) -> redis::RedisResult<T> {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(conn)
}

fn must<T: redis::FromRedisValue>(conn: &mut redis::Connection, port: u16, args: &[&str]) -> T {
    query(conn, args).unwrap_or_else(|e| panic!("node :{port}: {args:?}: {e}"))
}

/// Polls `cond` every 20 ms until it holds; panics after `limit`.
fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Makes one cluster of `nodes`: the first `nodes.len() / (replicas + 1)` are masters
/// with equal shares of the slots; each of the others replicates master `i % masters`.
/// `connect` opens a connection to a node's client port (plain or TLS). Returns once
/// every node knows every other one and each replica has been told its master; the
/// caller waits for `cluster_state:ok` and replication links as it needs.
pub fn form_cluster(
    nodes: &[ClusterNode],
    replicas: usize,
    connect: impl Fn(u16) -> redis::Connection,
) {
    let n = nodes.len();
    assert!(
        n > 0 && n.is_multiple_of(replicas + 1),
        "{n} nodes cannot be split into masters with {replicas} replicas each"
    );
    let masters = n / (replicas + 1);
    let mut conns: Vec<redis::Connection> = nodes.iter().map(|node| connect(node.port)).collect();
    let ids: Vec<String> = conns
        .iter_mut()
        .zip(nodes)
        .map(|(c, node)| must(c, node.port, &["CLUSTER", "MYID"]))
        .collect();
    for (i, (c, node)) in conns.iter_mut().zip(nodes).enumerate() {
        // Distinct epochs from the start, as redis-cli gives them: masters that all
        // begin at epoch 0 settle the collision among themselves, one bump at a time.
        let epoch = (i + 1).to_string();
        let _: () = must(c, node.port, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch]);
    }
    for (m, (c, node)) in conns.iter_mut().zip(nodes).take(masters).enumerate() {
        let lo = m as u32 * SLOTS / masters as u32;
        let hi = (m as u32 + 1) * SLOTS / masters as u32 - 1;
        add_slots(c, node.port, lo, hi);
    }
    // Node 0 meets every other node; gossip tells the rest about each other.
    for node in &nodes[1..] {
        let (port, bus) = (node.port.to_string(), node.bus_port.to_string());
        let _: () = must(
            &mut conns[0],
            nodes[0].port,
            &["CLUSTER", "MEET", "127.0.0.1", &port, &bus],
        );
    }
    wait_for("every node to know every other one", FORM_LIMIT, || {
        conns.iter_mut().all(|c| knows_all(c, &ids))
    });
    for (k, (c, node)) in conns.iter_mut().zip(nodes).skip(masters).enumerate() {
        let master = &ids[k % masters];
        // Refused ("Unknown node") until the replica has the master's entry from gossip.
        let start = Instant::now();
        while let Err(e) = query::<()>(c, &["CLUSTER", "REPLICATE", master]) {
            assert!(
                start.elapsed() < FORM_LIMIT,
                "node :{}: CLUSTER REPLICATE {master} still refused after {FORM_LIMIT:?}: {e}",
                node.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `CLUSTER ADDSLOTSRANGE lo hi`, or `ADDSLOTS` with every slot on a server without it
/// (before Redis 7.0).
fn add_slots(conn: &mut redis::Connection, port: u16, lo: u32, hi: u32) {
    let (l, h) = (lo.to_string(), hi.to_string());
    match query::<()>(conn, &["CLUSTER", "ADDSLOTSRANGE", &l, &h]) {
        Ok(()) => {}
        Err(e) if e.to_string().to_lowercase().contains("unknown subcommand") => {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("ADDSLOTS");
            for slot in lo..=hi {
                cmd.arg(slot);
            }
            cmd.query::<()>(conn)
                .unwrap_or_else(|e| panic!("node :{port}: CLUSTER ADDSLOTS {lo}..={hi}: {e}"));
        }
        Err(e) => panic!("node :{port}: CLUSTER ADDSLOTSRANGE {lo} {hi}: {e}"),
    }
}

/// Whether the node's CLUSTER NODES lists every id in `ids`, none of them still in a
/// handshake or without an address.
fn knows_all(conn: &mut redis::Connection, ids: &[String]) -> bool {
    let Ok(table) = query::<String>(conn, &["CLUSTER", "NODES"]) else {
        return false;
    };
    ids.iter().all(|id| {
        table.lines().any(|line| {
            let mut fields = line.split(' ');
            fields.next() == Some(id.as_str())
                && fields
                    .nth(1)
                    .is_some_and(|flags| !flags.contains("handshake") && !flags.contains("noaddr"))
        })
    })
}
