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
//!
//! Every connection opened here is named `<name>:<client uuid>` ([`named`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::runtime::Handle;

use crate::background::Background;
use crate::config::{Config, Deployment, ReplicaSync};
use crate::error::Result;
use crate::wire::slot::key_slot;

#[cfg(feature = "cluster")]
mod cluster;
mod lanes;
mod named;
mod open;
mod replies;
#[cfg(feature = "sentinel")]
mod sentinel;

#[cfg(feature = "cluster")]
use cluster::ClusterBackend;
use lanes::Lanes;
pub(crate) use named::set_name;
#[cfg(feature = "cluster")]
pub(crate) use named::setname;
use named::NamedManager;
#[cfg(feature = "cluster")]
pub(crate) use open::{cluster_client, connect_cluster};
pub(crate) use open::{connect_error, open_client};
use open::{connect_manager, open_lane};
use replies::parse_master_role;
pub(crate) use replies::Synced;
#[cfg(feature = "sentinel")]
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
        manager: NamedManager,
        client: redis::Client,
        /// The server's `host:port`, as an error names it.
        addr: String,
        config: Config,
        lanes: Lanes<MultiplexedConnection>,
        /// `ROLE` said the server has no replica (and nothing said otherwise since).
        /// Until the first synced call it is not known, and counts as none.
        no_replica: AtomicBool,
    },
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<SentinelMaster>),
    #[cfg(feature = "cluster")]
    Cluster(ClusterBackend),
}

impl Conn {
    // A single-server build (no `cluster`, no `sentinel`) has no service to start.
    #[cfg_attr(
        not(any(feature = "cluster", feature = "sentinel")),
        allow(unused_variables)
    )]
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
                    addr: open::addr_of(&client),
                    client,
                    config: config.clone(),
                    lanes: Lanes::new(),
                    no_replica: AtomicBool::new(true),
                }
            }
            #[cfg(feature = "sentinel")]
            Deployment::Sentinel {
                sentinels,
                master_name,
            } => Backend::Sentinel(
                SentinelMaster::connect(sentinels, master_name, config, runtime, background)
                    .await?,
            ),
            #[cfg(feature = "cluster")]
            Deployment::Cluster { nodes } => {
                Backend::Cluster(ClusterBackend::connect(nodes, config, runtime, background).await?)
            }
        };
        let sync = match (deployment, &config.replica_sync) {
            (_, Some(chosen)) => chosen.clone(),
            // A single server has no failover to guard against; WAIT would only add a
            // round trip (and block for the timeout where replicas are absent).
            (Deployment::Single { .. }, None) => ReplicaSync::Off,
            #[allow(unreachable_patterns)]
            (_, None) => ReplicaSync::default_wait(),
        };
        let sharded = match &backend {
            #[cfg(feature = "cluster")]
            Backend::Cluster(c) => c.sharded(config.sharded_pubsub).await,
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
    #[cfg(feature = "cluster")]
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
        #[cfg(feature = "cluster")]
        if matches!(*self.backend, Backend::Cluster(_)) {
            return true;
        }
        false
    }

    pub(crate) fn sync(&self) -> &ReplicaSync {
        &self.sync
    }

    /// The Sentinel view of the master, for the pub/sub hub to follow.
    #[cfg(feature = "sentinel")]
    pub(crate) fn sentinel(&self) -> Option<Arc<SentinelMaster>> {
        match &*self.backend {
            Backend::Sentinel(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// The server this connection talks to, as an error names it: `host:port` of the
    /// single server or the current Sentinel master, or the cluster's seed nodes.
    pub(crate) fn addr(&self) -> String {
        match &*self.backend {
            Backend::Single { addr, .. } => addr.clone(),
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(s) => s.addr(),
            #[cfg(feature = "cluster")]
            Backend::Cluster(c) => c.addrs.clone(),
        }
    }

    /// Classifies an error of a command about `key` sent here (see
    /// [`Error::from_redis`]).
    pub(crate) fn error(&self, e: RedisError, key: &str) -> crate::error::Error {
        crate::error::Error::from_redis(e, key, self.response_timeout, &self.addr())
    }

    /// Sends one command and returns its reply; server errors become `Err`.
    pub(crate) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        let reply = match &*self.backend {
            Backend::Single { manager, .. } => manager.send(cmd).await,
            // Boxed: inline, their states would make every lock call's future as large
            // as the largest of them, and it is moved whole on its way to the runtime.
            #[cfg(feature = "cluster")]
            Backend::Cluster(c) => Box::pin(c.query(cmd)).await,
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(s) => return Box::pin(s.query(cmd)).await,
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
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    pub(crate) async fn query_synced(
        &self,
        cmd: &Cmd,
        key: &[u8],
        wrote: fn(&Value) -> bool,
    ) -> RedisResult<(Value, Synced)> {
        match &self.sync {
            ReplicaSync::Off => Ok((self.query(cmd).await?, Synced::NotAsked)),
            // Boxed for the size of the common path's future (see `query`).
            ReplicaSync::Wait { timeout, acks, .. } => {
                Box::pin(self.query_waited(cmd, key, wrote, *timeout, *acks)).await
            }
        }
    }

    /// [`query_synced`](Self::query_synced) with replica sync on.
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    async fn query_waited(
        &self,
        cmd: &Cmd,
        key: &[u8],
        wrote: fn(&Value) -> bool,
        timeout: std::time::Duration,
        acks: u32,
    ) -> RedisResult<(Value, Synced)> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(acks).arg(timeout.as_millis() as u64);
        let wait_cmd = wait.clone();
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone()).add_command(wait);
        let replies = match &*self.backend {
            Backend::Single {
                client,
                config,
                lanes,
                no_replica,
                ..
            } => {
                // As on Sentinel: a server believed to have no replica is asked again
                // before `WAIT` is skipped, as one may have attached since. Without
                // this, each call on a server without replicas waited out the timeout.
                if no_replica.load(Ordering::Relaxed) {
                    if !self.has_replicas(key).await {
                        return Ok((self.query(cmd).await?, Synced::NotAsked));
                    }
                    no_replica.store(false, Ordering::Relaxed);
                }
                let mut lane = lanes.take(|| open_lane(client, config)).await?;
                let replies = lane.conn().send_packed_commands(&pipe, 0, 2).await?;
                lane.keep();
                Ok::<_, RedisError>(replies)
            }
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(s) => {
                // A cached zero may be stale (a fresh master gains replicas within
                // seconds of a failover), so it is checked before WAIT is skipped.
                if s.replicas() == 0 && !self.has_replicas(key).await {
                    return Ok((s.query(cmd).await?, Synced::NotAsked));
                }
                s.query_pipeline(&pipe).await
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(c) => return c.query_synced(cmd, key, wrote, wait_cmd).await,
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
            // Irrefutable in a build with neither `sentinel` nor `cluster`.
            #[allow(irrefutable_let_patterns)]
            if let Backend::Single { no_replica, .. } = &*self.backend {
                no_replica.store(true, Ordering::Relaxed);
            }
            return Ok((reply, Synced::NotAsked));
        }
        Ok((reply, Synced::Acked(acked)))
    }

    /// Asks the node that owns `key` whether any replica is connected to it now. Only
    /// called when a `WAIT` came back with none, so the common path pays nothing.
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    async fn has_replicas(&self, key: &[u8]) -> bool {
        let role = redis::cmd("ROLE");
        let reply = match &*self.backend {
            Backend::Single { manager: m, .. } => m.send(&role).await,
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(s) => s.ask_role().await,
            #[cfg(feature = "cluster")]
            Backend::Cluster(c) => return c.has_replicas(key).await,
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
