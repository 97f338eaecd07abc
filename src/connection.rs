//! Command connections to each kind of deployment, and replica sync.
//!
//! The lock code sends every command through [`Conn::query`] (or [`Conn::query_synced`]
//! for writes that must reach a replica) and never asks what it talks to:
//!
//! - a single server: one redis-rs `ConnectionManager`;
//! - Sentinel: a `ConnectionManager` to the master the sentinels name, replaced when
//!   they name another one (polled, and checked at once after an error that smells of a
//!   failover);
//! - Cluster: redis-rs's cluster connection, which routes by key and follows `MOVED`.
//!
//! Replica sync sends `WAIT` in the same pipeline as the script, so it runs on the
//! connection that made the write: `WAIT` only counts the calling connection's writes.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use redis::aio::MultiplexedConnection;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::runtime::Handle;

use crate::background::Background;
use crate::config::{Config, Deployment, ReplicaSync, ShardedPubSub};
use crate::error::{Error, Result};
use crate::slot::key_slot;

mod lanes;
mod open;
mod sentinel;

use lanes::Lanes;
pub(crate) use open::{cluster_client, connect_error, open_client};
use open::{connect_manager, open_lane};
use sentinel::parse_master_role;
pub(crate) use sentinel::SentinelMaster;

/// The command connection of a client. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Conn {
    backend: Arc<Backend>,
    pub(crate) response_timeout: Duration,
    sync: ReplicaSync,
    /// Unlock messages go out with `SPUBLISH` (cluster with sharded pub/sub).
    sharded: bool,
}

#[allow(clippy::large_enum_variant)]
enum Backend {
    Single {
        manager: ConnectionManager,
        client: redis::Client,
        config: Config,
        lanes: Lanes<MultiplexedConnection>,
    },
    Sentinel(Arc<SentinelMaster>),
    Cluster {
        conn: ClusterConnection,
        replicas: Arc<ClusterReplicas>,
        client: ClusterClient,
        lanes: Lanes<ClusterConnection>,
    },
}

/// How many healthy replicas serve each slot, from `CLUSTER SLOTS`, refreshed in the
/// background. Replica sync skips `WAIT` for a slot without replicas (a master whose
/// replica was just promoted away, or a cluster without replicas): there is nothing
/// to wait for, and a `WAIT` would block the node's shared connection for its timeout.
pub(crate) struct ClusterReplicas {
    per_slot: RwLock<Vec<u8>>,
}

/// How often the cluster's replica counts are read again.
const CLUSTER_SCAN: Duration = Duration::from_secs(1);

impl ClusterReplicas {
    fn of(&self, slot: u16) -> u8 {
        self.per_slot.read()[slot as usize]
    }

    async fn refresh(&self, conn: &ClusterConnection) {
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").clone();
        let Ok(Value::Array(ranges)) = conn.clone().req_packed_command(&cmd).await else {
            return;
        };
        let mut table = vec![0u8; crate::slot::SLOTS as usize];
        for range in ranges {
            let Value::Array(items) = range else { continue };
            let (Some(Value::Int(lo)), Some(Value::Int(hi))) = (items.first(), items.get(1)) else {
                continue;
            };
            // Entries after the master are its replicas.
            let replicas = items.len().saturating_sub(3).min(u8::MAX as usize) as u8;
            for slot in (*lo).max(0)..=(*hi).min(crate::slot::SLOTS as i64 - 1) {
                table[slot as usize] = replicas;
            }
        }
        *self.per_slot.write() = table;
    }
}

async fn scan_cluster(conn: ClusterConnection, weak: std::sync::Weak<ClusterReplicas>) {
    loop {
        tokio::time::sleep(CLUSTER_SCAN).await;
        let Some(replicas) = weak.upgrade() else {
            return;
        };
        replicas.refresh(&conn).await;
    }
}

/// What the replica sync of one write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Synced {
    /// Sync is off, or there is no replica to wait for: nothing was asked.
    NotAsked,
    /// This many replicas acknowledged the write within the timeout.
    Acked(i64),
}

impl Conn {
    pub(crate) async fn connect(
        deployment: &Deployment,
        config: &Config,
        runtime: &Handle,
        background: &Background,
    ) -> Result<Conn> {
        let backend = match deployment {
            Deployment::Single { url } => {
                let client = match &config.redis_client {
                    Some(c) => c.clone(),
                    None => open_client(url, &config.tls)?,
                };
                Backend::Single {
                    manager: connect_manager(client.clone(), config).await?,
                    client,
                    config: config.clone(),
                    lanes: Lanes::new(),
                }
            }
            Deployment::Sentinel {
                sentinels,
                master_name,
            } => Backend::Sentinel(
                SentinelMaster::connect(sentinels, master_name, config, runtime, background)
                    .await?,
            ),
            Deployment::Cluster { nodes } => {
                let client = cluster_client(nodes, config, None)?;
                let limit = config.connect_timeout * 2 + config.response_timeout;
                let conn = tokio::time::timeout(limit, client.get_async_connection())
                    .await
                    .map_err(|_| Error::Timeout {
                        op: "connect",
                        after: limit,
                    })?
                    .map_err(|e| connect_error(e, config.connect_timeout))?;
                let replicas = Arc::new(ClusterReplicas {
                    per_slot: RwLock::new(vec![0; crate::slot::SLOTS as usize]),
                });
                replicas.refresh(&conn).await;
                background.service(
                    runtime,
                    scan_cluster(conn.clone(), Arc::downgrade(&replicas)),
                );
                Backend::Cluster {
                    conn,
                    replicas,
                    client,
                    lanes: Lanes::new(),
                }
            }
        };
        let sync = match (deployment, &config.replica_sync) {
            (_, Some(chosen)) => chosen.clone(),
            // A single server has no failover to guard against; WAIT would only add a
            // round trip (and block for the timeout where replicas are absent).
            (Deployment::Single { .. }, None) => ReplicaSync::Off,
            (_, None) => ReplicaSync::default_wait(),
        };
        let sharded = match (&backend, config.sharded_pubsub) {
            (Backend::Cluster { .. }, ShardedPubSub::On) => true,
            (Backend::Cluster { conn: c, .. }, ShardedPubSub::Auto) => {
                // Redis before 7.0 does not know the subcommand.
                let probe = redis::cmd("PUBSUB").arg("SHARDNUMSUB").clone();
                matches!(
                    c.clone().req_packed_command(&probe).await,
                    Ok(ref v) if !matches!(v, Value::ServerError(_))
                )
            }
            _ => false,
        };
        Ok(Conn {
            backend: Arc::new(backend),
            response_timeout: config.response_timeout,
            sync,
            sharded,
        })
    }

    /// True when unlock messages use sharded pub/sub.
    pub(crate) fn sharded(&self) -> bool {
        self.sharded
    }

    /// The command scripts publish unlock messages with.
    pub(crate) fn publish_command(&self) -> &'static str {
        if self.sharded {
            "spublish"
        } else {
            "publish"
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(*self.backend, Backend::Cluster { .. })
    }

    pub(crate) fn sync(&self) -> &ReplicaSync {
        &self.sync
    }

    /// The Sentinel view of the master, for the pub/sub hub to follow.
    pub(crate) fn sentinel(&self) -> Option<Arc<SentinelMaster>> {
        match &*self.backend {
            Backend::Sentinel(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// Sends one command and returns its reply; server errors become `Err`.
    pub(crate) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        let reply = match &*self.backend {
            Backend::Single { manager, .. } => manager.clone().send_packed_command(cmd).await,
            Backend::Cluster { conn, .. } => conn.clone().req_packed_command(cmd).await,
            Backend::Sentinel(s) => return s.query(cmd).await,
        };
        // Server errors arrive as values; make them errors here, once for all callers.
        reply.and_then(|v| v.extract_error())
    }

    /// Sends `cmd` (a write whose first key is `key`) followed by `WAIT`, on the same
    /// connection, when replica sync is on. Returns the command's reply and what the
    /// `WAIT` found.
    ///
    /// `wrote` tells from the reply whether the command wrote anything; on a cluster,
    /// where the script and `WAIT` go out one after the other, `WAIT` is only sent then.
    pub(crate) async fn query_synced(
        &self,
        cmd: &Cmd,
        key: &[u8],
        wrote: fn(&Value) -> bool,
    ) -> RedisResult<(Value, Synced)> {
        let ReplicaSync::Wait { timeout, acks, .. } = &self.sync else {
            return Ok((self.query(cmd).await?, Synced::NotAsked));
        };
        let mut wait = redis::cmd("WAIT");
        wait.arg(*acks).arg(timeout.as_millis() as u64);
        let wait_cmd = wait.clone();
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone()).add_command(wait);
        let replies = match &*self.backend {
            Backend::Single {
                client,
                config,
                lanes,
                ..
            } => {
                let mut lane = lanes.take(|| open_lane(client, config)).await?;
                let replies = lane.conn().send_packed_commands(&pipe, 0, 2).await?;
                lane.keep();
                Ok(replies)
            }
            Backend::Sentinel(s) => {
                // A cached zero may be stale (a fresh master gains replicas within
                // seconds of a failover), so it is checked before WAIT is skipped.
                if s.replicas() == 0 && !self.has_replicas(key).await {
                    return Ok((s.query(cmd).await?, Synced::NotAsked));
                }
                s.query_pipeline(&pipe).await
            }
            Backend::Cluster {
                replicas,
                client,
                lanes,
                ..
            } => {
                // Two steps, not a pipeline: a pipeline sent to a fixed node does not
                // follow MOVED, and a WAIT after a write-less reply (a busy lock) would
                // only hold the lane up. Both go to the slot's master over the lane's
                // one connection per node, so WAIT counts the write.
                let mut lane = lanes.take(|| client.get_async_connection()).await?;
                let slot = key_slot(key);
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                // The common case in one round trip: both to the slot's master as the
                // lane's slot map has it. A reply that is not the script's (MOVED, a
                // failover) falls back to the two steps below, which follow redirects.
                if replicas.of(slot) > 0 {
                    let mut pipe = redis::pipe();
                    pipe.add_command(cmd.clone()).add_command(wait_cmd.clone());
                    // A failed send may have run the script: the caller retries it with
                    // the same request id, as for any lost reply.
                    let replies = lane
                        .conn()
                        .route_pipeline(pipe, 0, 2, route.clone())
                        .await?;
                    let [reply, acked] = <[Value; 2]>::try_from(replies).map_err(|v| {
                        RedisError::from((
                            ErrorKind::UnexpectedReturnType,
                            "WAIT pipeline answered too few replies",
                            format!("{v:?}"),
                        ))
                    })?;
                    match reply.extract_error() {
                        Ok(reply) => {
                            let synced = if wrote(&reply) {
                                cluster_synced(acked, lane.conn(), replicas, slot).await?
                            } else {
                                Synced::NotAsked
                            };
                            lane.keep();
                            return Ok((reply, synced));
                        }
                        // Not served there (the slot moved): nothing ran; the steps
                        // below follow the redirect.
                        Err(e) if matches!(e.code(), Some("MOVED" | "ASK" | "TRYAGAIN")) => {}
                        Err(e) => return Err(e),
                    }
                }
                let reply = lane
                    .conn()
                    .req_packed_command(cmd)
                    .await
                    .and_then(|v| v.extract_error())?;
                if !wrote(&reply) {
                    lane.keep();
                    return Ok((reply, Synced::NotAsked));
                }
                // ROLE goes over the lane too: its slot map is the one that just found
                // the slot's master (the shared connection may not have followed a
                // failover yet, having sent nothing to that slot since).
                if replicas.of(slot) == 0
                    && !cluster_has_replicas(lane.conn(), replicas, slot).await
                {
                    lane.keep();
                    return Ok((reply, Synced::NotAsked));
                }
                let acked = lane
                    .conn()
                    .route_command(wait_cmd, RoutingInfo::SingleNode(route))
                    .await?
                    .extract_error()?;
                let synced = cluster_synced(acked, lane.conn(), replicas, slot).await?;
                lane.keep();
                return Ok((reply, synced));
            }
        }?;
        let mut it = replies.into_iter();
        let (Some(reply), Some(acked)) = (it.next(), it.next()) else {
            return Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "WAIT pipeline answered too few replies",
            )));
        };
        let reply = reply.extract_error()?;
        let acked = match acked.extract_error()? {
            Value::Int(n) => n,
            other => {
                return Err(RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "WAIT answered a non-integer",
                    format!("{other:?}"),
                )))
            }
        };
        if acked == 0 && !self.has_replicas(key).await {
            // The node has no replica (anymore): nothing to sync with, as if unasked.
            return Ok((reply, Synced::NotAsked));
        }
        Ok((reply, Synced::Acked(acked)))
    }

    /// Asks the node that owns `key` whether any replica is connected to it now. Only
    /// called when a `WAIT` came back with none, so the common path pays nothing.
    async fn has_replicas(&self, key: &[u8]) -> bool {
        let role = redis::cmd("ROLE");
        let reply = match &*self.backend {
            Backend::Single { manager: m, .. } => m.clone().send_packed_command(&role).await,
            Backend::Sentinel(s) => s.ask_role().await,
            Backend::Cluster {
                conn: c, replicas, ..
            } => return cluster_has_replicas(&mut c.clone(), replicas, key_slot(key)).await,
        };
        // When in doubt, keep the answer that is safe for the lock: replicas exist.
        !matches!(reply.as_ref().map(parse_master_role), Ok(Some(0)))
    }

    /// Groups keys so that each group can go into one multi-key command: by slot on a
    /// cluster, all together elsewhere.
    pub(crate) fn group_by_slot<T>(&self, items: Vec<T>, key: impl Fn(&T) -> &[u8]) -> Vec<Vec<T>> {
        if !self.is_cluster() {
            return if items.is_empty() {
                Vec::new()
            } else {
                vec![items]
            };
        }
        let mut groups: std::collections::BTreeMap<u16, Vec<T>> = Default::default();
        for item in items {
            groups.entry(key_slot(key(&item))).or_default().push(item);
        }
        groups.into_values().collect()
    }
}

/// Asks the master of `slot`, over `conn`, whether any replica is connected to it now,
/// and keeps the count. When in doubt, the answer that is safe for the lock: replicas
/// exist.
/// What a `WAIT` reply on a cluster says: 0 acknowledgements from a slot that has no
/// replica (any more) asked nothing.
async fn cluster_synced(
    acked: Value,
    conn: &mut ClusterConnection,
    replicas: &ClusterReplicas,
    slot: u16,
) -> RedisResult<Synced> {
    match acked {
        Value::Int(0) if !cluster_has_replicas(conn, replicas, slot).await => Ok(Synced::NotAsked),
        Value::Int(n) => Ok(Synced::Acked(n)),
        other => Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "WAIT answered a non-integer",
            format!("{other:?}"),
        ))),
    }
}

async fn cluster_has_replicas(
    conn: &mut ClusterConnection,
    replicas: &ClusterReplicas,
    slot: u16,
) -> bool {
    let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
    let reply = conn
        .route_command(redis::cmd("ROLE"), RoutingInfo::SingleNode(route))
        .await;
    if let Ok(Some(n)) = reply.as_ref().map(parse_master_role) {
        replicas.per_slot.write()[slot as usize] = n.min(u8::MAX as usize) as u8;
    }
    !matches!(reply.as_ref().map(parse_master_role), Ok(Some(0)))
}
