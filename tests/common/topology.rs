//! Real Redis topologies on loopback: master + replicas + sentinels, and a 6-node
//! cluster (formed with commands through the redis crate, see `cluster_setup.rs`).
//! Blocking code: call it from `spawn_blocking` or `block_in_place` in async tests. Every wait is bounded and panics with what it was waiting for.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster_setup::{form_cluster, ClusterNode};
use super::{free_port, raw_cmd_within, wall_clock, RedisServer};

const READY_LIMIT: Duration = Duration::from_secs(30);
const FAILOVER_LIMIT: Duration = Duration::from_secs(20);

fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "WAIT {:.3}s @{} for {what}",
        start.elapsed().as_secs_f64(),
        wall_clock()
    );
}

fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

/// Whether `replica` has a live link to its master.
fn linked(replica: &RedisServer) -> bool {
    replica
        .try_cmd::<String>(&["INFO", "replication"])
        .is_ok_and(|i| i.contains("master_link_status:up"))
}

/// Whether a write at `master` is acknowledged by `replicas` replicas within a short
/// `WAIT`.
///
/// A replica reports its link up once it has loaded the master's snapshot, but after a
/// diskless sync the master starts streaming writes to it only on an ACK that arrives
/// after the master noticed the end of the transfer. The replica's first ACK often comes
/// earlier and does not count; the next one comes with its once-a-second cron. Until
/// then every `WAIT` blocks for its whole timeout (the crate's default is 1 s), and so
/// does every command queued behind it on the same connection, lease renewals included.
fn acks_writes(master: &RedisServer, replicas: usize) -> bool {
    let Ok(client) = redis::Client::open(master.url()) else {
        return false;
    };
    let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(500)) else {
        return false;
    };
    let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
    // A cluster node takes only keys of its own slots: try names until one lands.
    for i in 0..200 {
        let key = format!("rlock-harness:ready:{i}");
        match redis::cmd("SET").arg(&key).arg(1).query::<()>(&mut c) {
            Ok(()) => {}
            Err(e) if e.code() == Some("MOVED") => continue,
            Err(_) => return false,
        }
        if redis::cmd("DEL").arg(&key).query::<i64>(&mut c).is_err() {
            return false;
        }
        return redis::cmd("WAIT")
            .arg(replicas)
            .arg(100)
            .query::<i64>(&mut c)
            .is_ok_and(|acked| acked >= replicas as i64);
    }
    false
}

fn online_replicas(node: &RedisServer) -> usize {
    node.try_cmd::<String>(&["INFO", "replication"])
        .map(|i| i.matches("state=online").count())
        .unwrap_or(0)
}

fn is_master(port: u16) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) else {
        return false;
    };
    let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(500)) else {
        return false;
    };
    let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
    let role: redis::RedisResult<Vec<redis::Value>> = redis::cmd("ROLE").query(&mut c);
    matches!(role.as_deref(), Ok([redis::Value::BulkString(r), ..]) if r == b"master")
}

/// (master port, replica ports) serving `slot` in `node`'s CLUSTER SLOTS.
fn shard_seen_by(node: &RedisServer, slot: u16) -> Option<(u16, Vec<u16>)> {
    let slots = node
        .try_cmd::<Vec<redis::Value>>(&["CLUSTER", "SLOTS"])
        .ok()?;
    let int = |v: &redis::Value| match v {
        redis::Value::Int(i) => Some(*i),
        _ => None,
    };
    slots.iter().find_map(|range| {
        let redis::Value::Array(items) = range else {
            return None;
        };
        let (lo, hi) = (int(items.first()?)?, int(items.get(1)?)?);
        if !(lo..=hi).contains(&i64::from(slot)) {
            return None;
        }
        let ports: Vec<u16> = items[2..]
            .iter()
            .filter_map(|node| match node {
                redis::Value::Array(f) => int(f.get(1)?).map(|p| p as u16),
                _ => None,
            })
            .collect();
        let (master, replicas) = ports.split_first()?;
        Some((*master, replicas.to_vec()))
    })
}

/// One redis-sentinel process with its own writable config file.
pub struct SentinelProc {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl SentinelProc {
    /// A sentinel monitoring `127.0.0.1:<master_port>` as `name` (quorum 2, down after
    /// 1 s, failover timeout 5 s).
    pub fn start(dir: PathBuf, name: &str, master_port: u16) -> SentinelProc {
        std::fs::create_dir_all(&dir).unwrap();
        for _ in 0..10 {
            let port = free_port();
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\nlogfile {}\n\
                     sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {name} 1000\n\
                     sentinel failover-timeout {name} 5000\n",
                    dir.display(),
                    dir.join("log").display()
                ),
            )
            .unwrap();
            let (bin, mode) = super::server_bin::sentinel_cmd();
            let mut child = Command::new(&bin)
                .arg(&conf)
                .args(&mode)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start the sentinel `{bin}`: {e}"));
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(5) {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                let mut s = SentinelProc {
                    port,
                    dir: dir.clone(),
                    child: None,
                };
                if s.try_cmd::<String>(&["PING"]).is_ok() {
                    s.child = Some(child);
                    return s;
                }
                // Not ours yet: keep the directory.
                std::mem::forget(s);
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start redis-sentinel in {}", dir.display());
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn try_cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        super::raw_cmd(&self.url(), args)
    }

    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("sentinel {args:?}: {e}"))
    }

    /// The master port this sentinel names now.
    pub fn master_port(&self, name: &str) -> Option<u16> {
        let addr: Option<(String, u16)> = self
            .try_cmd(&["SENTINEL", "get-master-addr-by-name", name])
            .ok()?;
        addr.map(|a| a.1)
    }

    /// Whether this sentinel sees `replicas` replicas and `others` other sentinels.
    pub fn sees(&self, name: &str, replicas: usize, others: usize) -> bool {
        let Ok(fields) = self.try_cmd::<Vec<String>>(&["SENTINEL", "MASTER", name]) else {
            return false;
        };
        let get = |k: &str| {
            fields
                .chunks(2)
                .find(|kv| kv[0] == k)
                .and_then(|kv| kv.get(1))
                .and_then(|v| v.parse::<usize>().ok())
        };
        // At least: a stray replica or sentinel of another test whose master had this
        // port before (see `SentinelTopology::start_with`) may be counted.
        get("num-slaves").is_some_and(|n| n >= replicas)
            && get("num-other-sentinels").is_some_and(|n| n >= others)
    }
}

impl Drop for SentinelProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "---- sentinel :{} log tail ----\n{}\n---- end :{} ----",
                self.port,
                lines[lines.len().saturating_sub(30)..].join("\n"),
                self.port
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// 1 master + 2 replicas + 3 sentinels.
pub struct SentinelTopology {
    pub master: RedisServer,
    pub replicas: Vec<RedisServer>,
    pub sentinels: Vec<SentinelProc>,
    pub master_name: String,
}

impl SentinelTopology {
    pub fn start() -> SentinelTopology {
        Self::start_with(&[])
    }

    /// Extra arguments go to every data node.
    pub fn start_with(extra: &[&str]) -> SentinelTopology {
        let started = Instant::now();
        let mut args = vec!["--repl-diskless-sync-delay", "0"];
        args.extend_from_slice(extra);
        let master = RedisServer::start_with(&args);
        let mport = master.port.to_string();
        let mut rargs = args.clone();
        rargs.extend_from_slice(&["--replicaof", "127.0.0.1", &mport]);
        let replicas: Vec<RedisServer> = (0..2).map(|_| RedisServer::start_with(&rargs)).collect();
        // Asked of our replicas, not counted at the master: a replica of another test's
        // killed master may reconnect to this port when it is reused, and be counted too.
        wait_until("2 replicas linked to the master", READY_LIMIT, || {
            replicas.iter().all(linked)
        });
        // Linked is not yet replicating: see `acks_writes`.
        wait_until(
            "the master's writes acknowledged by 2 replicas",
            READY_LIMIT,
            || acks_writes(&master, 2),
        );
        // Sentinels learn replicas from the master's INFO, so they start after them.
        let name = "mymaster".to_string();
        let sentinels: Vec<SentinelProc> = (0..3)
            .map(|i| {
                SentinelProc::start(master.dir.join(format!("sentinel-{i}")), &name, master.port)
            })
            .collect();
        wait_until("sentinels to see the topology", READY_LIMIT, || {
            sentinels.iter().all(|s| s.sees(&name, 2, 2))
        });
        eprintln!("sentinel topology ready in {:?}", started.elapsed());
        SentinelTopology {
            master,
            replicas,
            sentinels,
            master_name: name,
        }
    }

    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| s.url()).collect()
    }

    /// The master port as the first sentinel that answers names it.
    pub fn current_master_port(&self) -> u16 {
        self.sentinels
            .iter()
            .find_map(|s| s.master_port(&self.master_name))
            .expect("no sentinel names a master")
    }

    pub fn nodes(&self) -> Vec<&RedisServer> {
        std::iter::once(&self.master)
            .chain(&self.replicas)
            .collect()
    }

    pub fn node_by_port(&mut self, port: u16) -> &mut RedisServer {
        std::iter::once(&mut self.master)
            .chain(&mut self.replicas)
            .find(|n| n.port == port)
            .expect("no node on that port")
    }

    /// SENTINEL FAILOVER, then waits for a new, writable master that every sentinel
    /// names. Returns its port.
    pub fn failover(&self) -> u16 {
        let old = self.current_master_port();
        let _: String = self.sentinels[0].cmd(&["SENTINEL", "FAILOVER", &self.master_name]);
        self.wait_new_master(old, FAILOVER_LIMIT)
    }

    /// Waits until all sentinels agree on a master other than `old` that says it is one.
    pub fn wait_new_master(&self, old: u16, limit: Duration) -> u16 {
        let mut found = 0;
        wait_until("a new master", limit, || {
            let ports: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|s| s.master_port(&self.master_name))
                .collect();
            match ports[0] {
                Some(p) if p != old && ports.iter().all(|q| *q == Some(p)) && is_master(p) => {
                    found = p;
                    true
                }
                _ => false,
            }
        });
        found
    }

    /// Waits until the current master has `n` online replicas.
    pub fn wait_online_replicas(&self, n: usize, limit: Duration) {
        let port = self.current_master_port();
        let node = self.nodes().into_iter().find(|s| s.port == port).unwrap();
        wait_until("online replicas", limit, || online_replicas(node) >= n);
    }
}

/// 3 masters + 3 replicas.
pub struct ClusterTopology {
    pub nodes: Vec<RedisServer>,
}

impl ClusterTopology {
    pub fn start() -> ClusterTopology {
        let started = Instant::now();
        let (nodes, spec): (Vec<RedisServer>, Vec<ClusterNode>) = (0..6)
            .map(|_| {
                // An explicit bus port: the default port + 10000 may be taken or too big.
                let bus_port = free_port();
                let bus = bus_port.to_string();
                let node = RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus,
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--repl-diskless-sync-delay",
                    "0",
                ]);
                let spec = ClusterNode {
                    port: node.port,
                    bus_port,
                };
                (node, spec)
            })
            .unzip();
        form_cluster(&spec, 1, |port| {
            let node = nodes.iter().find(|n| n.port == port).unwrap();
            let conn = node.conn();
            conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            conn
        });
        let topo = ClusterTopology { nodes };
        topo.wait_ok(READY_LIMIT);
        for n in &topo.nodes {
            if !is_master(n.port) {
                wait_until("replica link up", READY_LIMIT, || {
                    n.try_cmd::<String>(&["INFO", "replication"])
                        .ok()
                        .and_then(|i| info_field(&i, "master_link_status"))
                        .as_deref()
                        == Some("up")
                });
            }
        }
        // Linked is not yet replicating: see `acks_writes`. Each master has one replica.
        for n in &topo.nodes {
            if is_master(n.port) {
                wait_until(
                    "a master's writes acknowledged by its replica",
                    READY_LIMIT,
                    || acks_writes(n, 1),
                );
            }
        }
        eprintln!("cluster ready in {:?}", started.elapsed());
        topo
    }

    fn wait_ok(&self, limit: Duration) {
        wait_until("cluster_state:ok on every live node", limit, || {
            self.live().all(|n| {
                n.try_cmd::<String>(&["CLUSTER", "INFO"])
                    .map(|i| info_field(&i, "cluster_state").as_deref() == Some("ok"))
                    .unwrap_or(false)
            })
        });
    }

    fn live(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.try_cmd::<String>(&["PING"]).is_ok())
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    pub fn keyslot(&self, key: &str) -> u16 {
        self.live()
            .find_map(|n| n.try_cmd::<u16>(&["CLUSTER", "KEYSLOT", key]).ok())
            .expect("no live node")
    }

    /// (master port, replica ports) serving `slot`, as the first live node that answers sees it.
    fn shard_of(&self, slot: u16) -> Option<(u16, Vec<u16>)> {
        self.live().find_map(|n| shard_seen_by(n, slot))
    }

    pub fn master_of_slot(&self, slot: u16) -> u16 {
        self.shard_of(slot).expect("slot not served").0
    }

    /// Waits (bounded) until a node lists a replica for the slot's master.
    pub fn replica_of_slot(&self, slot: u16) -> u16 {
        let mut found = 0;
        wait_until("a replica listed for the slot", READY_LIMIT, || match self
            .shard_of(slot)
            .and_then(|s| s.1.first().copied())
        {
            Some(r) => {
                found = r;
                true
            }
            None => false,
        });
        found
    }

    /// CLUSTER FAILOVER at a replica of the slot's master; waits until every live node
    /// maps the slot to it. Returns the new master's port.
    pub fn failover_slot(&self, slot: u16) -> u16 {
        let replica = self.replica_of_slot(slot);
        let node = self.nodes.iter().find(|n| n.port == replica).unwrap();
        let _: String = node.cmd(&["CLUSTER", "FAILOVER"]);
        // Every node, not just one: a client may bootstrap from any of them.
        wait_until("the replica to take over", FAILOVER_LIMIT, || {
            is_master(replica)
                && self
                    .live()
                    .all(|n| shard_seen_by(n, slot).map(|s| s.0) == Some(replica))
        });
        replica
    }

    /// Waits until the slot is served by a node other than `old` and the cluster is ok.
    pub fn wait_slot_moved(&self, slot: u16, old: u16, limit: Duration) -> u16 {
        let mut new = 0;
        wait_until("the slot to move", limit, || match self.shard_of(slot) {
            Some((m, _)) if m != old && is_master(m) => {
                new = m;
                true
            }
            _ => false,
        });
        self.wait_ok(limit);
        new
    }

    pub fn node_by_port(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("no node on that port")
    }

    /// `:port=n` for each node answering PUBSUB SHARDNUMSUB for `channel`: where the
    /// sharded subscriptions of a channel actually are.
    pub fn shard_subscribers(&self, channel: &str) -> String {
        let limit = Duration::from_millis(300);
        self.nodes
            .iter()
            .map(|n| {
                let v = raw_cmd_within::<Vec<redis::Value>>(
                    &n.url(),
                    &["PUBSUB", "SHARDNUMSUB", channel],
                    limit,
                );
                match v.as_deref() {
                    Ok([_, redis::Value::Int(k)]) => format!(":{}={k}", n.port),
                    _ => format!(":{}=?", n.port),
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Each node's own view of the cluster: who it thinks serves what. A failure after
    /// a failover is usually one node seeing something the others do not.
    pub fn dump_views(&self) {
        // Short: a stopped or dying node must not stall the report.
        let limit = Duration::from_millis(300);
        for n in &self.nodes {
            let url = n.url();
            let nodes = raw_cmd_within::<String>(&url, &["CLUSTER", "NODES"], limit);
            let Ok(nodes) = nodes else {
                eprintln!("==== :{} unreachable: {}", n.port, nodes.unwrap_err());
                continue;
            };
            let state = raw_cmd_within::<String>(&url, &["CLUSTER", "INFO"], limit)
                .map(|i| {
                    ["cluster_state", "cluster_current_epoch"]
                        .map(|f| format!("{f}={}", info_field(&i, f).unwrap_or_default()))
                        .join(" ")
                })
                .unwrap_or_default();
            eprintln!("==== :{} CLUSTER INFO {state}", n.port);
            eprintln!("==== :{} CLUSTER NODES\n{}", n.port, nodes.trim_end());
            eprintln!("==== :{} CLUSTER SLOTS {}", n.port, slots_summary(n, limit));
        }
    }
}

/// `lo-hi:master[replicas] ...` from a node's CLUSTER SLOTS.
fn slots_summary(node: &RedisServer, limit: Duration) -> String {
    let Ok(slots) = raw_cmd_within::<Vec<redis::Value>>(&node.url(), &["CLUSTER", "SLOTS"], limit)
    else {
        return "(no answer)".into();
    };
    let int = |v: Option<&redis::Value>| match v {
        Some(redis::Value::Int(i)) => *i,
        _ => -1,
    };
    slots
        .iter()
        .filter_map(|range| match range {
            redis::Value::Array(items) => Some(items),
            _ => None,
        })
        .map(|items| {
            let ports: Vec<i64> = items
                .iter()
                .skip(2)
                .map(|node| match node {
                    redis::Value::Array(f) => int(f.get(1)),
                    _ => -1,
                })
                .collect();
            format!(
                "{}-{}:{}{:?}",
                int(items.first()),
                int(items.get(1)),
                ports.first().copied().unwrap_or(-1),
                ports.get(1..).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl Drop for ClusterTopology {
    fn drop(&mut self) {
        // Before the nodes drop: while they still answer, and before killing one node
        // fills the others' logs with its disconnection.
        if std::thread::panicking() {
            eprintln!("==== cluster views @{}", wall_clock());
            self.dump_views();
            for n in &mut self.nodes {
                n.report_log();
            }
        }
    }
}
