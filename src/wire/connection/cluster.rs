//! The command connection to a Redis Cluster (feature `cluster`): redis-rs's cluster
//! connection, which routes by key and follows `MOVED`, the replica counts per slot that
//! replica sync needs, and synced writes over lanes of their own.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::runtime::Handle;

use super::lanes::Lanes;
use super::open::{addrs_of, cluster_client, connect_cluster, connect_error, connect_timed_out};
use super::replies::{parse_master_role, Synced};
use crate::background::Background;
use crate::config::{Config, ShardedPubSub};
use crate::error::Result;
use crate::wire::slot::key_slot;

/// The cluster's side of [`Conn`](super::Conn).
pub(super) struct ClusterBackend {
    conn: ClusterConnection,
    replicas: Arc<ClusterReplicas>,
    client: ClusterClient,
    lanes: Lanes<ClusterConnection>,
    /// What the lanes' node connections are named.
    name: String,
    /// The seed nodes, as an error names them.
    pub(super) addrs: String,
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
        let mut table = vec![0u8; crate::wire::slot::SLOTS as usize];
        for range in ranges {
            let Value::Array(items) = range else { continue };
            let (Some(Value::Int(lo)), Some(Value::Int(hi))) = (items.first(), items.get(1)) else {
                continue;
            };
            // Entries after the master are its replicas.
            let replicas = items.len().saturating_sub(3).min(u8::MAX as usize) as u8;
            for slot in (*lo).max(0)..=(*hi).min(crate::wire::slot::SLOTS as i64 - 1) {
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

impl ClusterBackend {
    pub(super) async fn connect(
        nodes: &[String],
        config: &Config,
        runtime: &Handle,
        background: &Background,
    ) -> Result<ClusterBackend> {
        let client = cluster_client(nodes, config, None)?;
        let limit = config.connect_timeout * 2 + config.response_timeout;
        let name = config.connection_name();
        let conn = tokio::time::timeout(limit, connect_cluster(&client, &name))
            .await
            .map_err(|_| connect_timed_out(limit, &addrs_of(nodes)))?
            .map_err(|e| connect_error(e, config.connect_timeout, &addrs_of(nodes)))?;
        let addrs = format!("cluster {}", addrs_of(nodes));
        let replicas = Arc::new(ClusterReplicas {
            per_slot: RwLock::new(vec![0; crate::wire::slot::SLOTS as usize]),
        });
        replicas.refresh(&conn).await;
        background.service(
            runtime,
            scan_cluster(conn.clone(), Arc::downgrade(&replicas)),
        );
        Ok(ClusterBackend {
            conn,
            replicas,
            client,
            lanes: Lanes::new(),
            name,
            addrs,
        })
    }

    /// Whether unlock messages go out with `SPUBLISH`.
    pub(super) async fn sharded(&self, setting: ShardedPubSub) -> bool {
        match setting {
            ShardedPubSub::On => true,
            ShardedPubSub::Off => false,
            ShardedPubSub::Auto => {
                // Redis before 7.0 does not know the subcommand.
                let probe = redis::cmd("PUBSUB").arg("SHARDNUMSUB").clone();
                matches!(
                    self.conn.clone().req_packed_command(&probe).await,
                    Ok(ref v) if !matches!(v, Value::ServerError(_))
                )
            }
        }
    }

    pub(super) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        self.conn.clone().req_packed_command(cmd).await
    }

    /// A write followed by `WAIT` at the slot's master (see [`super::Conn::query_synced`]).
    pub(super) async fn query_synced(
        &self,
        cmd: &Cmd,
        key: &[u8],
        wrote: fn(&Value) -> bool,
        wait_cmd: Cmd,
    ) -> RedisResult<(Value, Synced)> {
        let (replicas, lanes) = (&self.replicas, &self.lanes);
        // Both go to the slot's master over the lane's one connection per node, so
        // WAIT counts the write.
        let mut lane = lanes
            .take(|| connect_cluster(&self.client, &self.name))
            .await?;
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
        // Two steps: the script through the cluster connection, which follows MOVED,
        // then WAIT where it went, only if it wrote.
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
        if replicas.of(slot) == 0 && !cluster_has_replicas(lane.conn(), replicas, slot).await {
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
        Ok((reply, synced))
    }

    /// Asks the master that owns `key` whether any replica is connected to it now.
    pub(super) async fn has_replicas(&self, key: &[u8]) -> bool {
        cluster_has_replicas(&mut self.conn.clone(), &self.replicas, key_slot(key)).await
    }
}

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

/// Asks the master of `slot`, over `conn`, whether any replica is connected to it now,
/// and keeps the count. When in doubt, the answer that is safe for the lock: replicas
/// exist.
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
