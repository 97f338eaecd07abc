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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, IntoConnectionInfo, RedisError, RedisResult, ServerErrorKind, Value};
use tokio::runtime::Handle;
use tokio::sync::{watch, Notify};

use crate::background::Background;
use crate::config::{Config, Deployment, ReplicaSync, ShardedPubSub, TlsSettings};
use crate::error::{Error, Result};
use crate::slot::key_slot;

/// The command connection of a client. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Conn {
    backend: Arc<Backend>,
    pub(crate) response_timeout: Duration,
    sync: ReplicaSync,
    /// Unlock messages go out with `SPUBLISH` (cluster with sharded pub/sub).
    sharded: bool,
}

enum Backend {
    Single(ConnectionManager),
    Sentinel(Arc<SentinelMaster>),
    Cluster(ClusterConnection, Arc<ClusterReplicas>),
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

pub(crate) fn manager_config(config: &Config) -> ConnectionManagerConfig {
    // One quick retry only: a request that finds the connection broken waits for the
    // reconnect, and must fail within the configured timeouts, not after a long backoff.
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.response_timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100))
}

fn bad_url(url: &str, e: RedisError) -> Error {
    Error::InvalidConfig(format!("bad Redis URL `{url}`: {e}"))
}

/// A client for `url` with the client's TLS settings. Every connection the crate opens
/// starts here (or at [`cluster_client`], which checks its URLs here first), so a
/// `rediss://` URL gets the same certificates wherever it is used.
pub(crate) fn open_client(url: &str, tls: &TlsSettings) -> Result<redis::Client> {
    #[cfg(not(feature = "tls-rustls"))]
    if url
        .get(..9)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"))
    {
        // redis-rs's own message does not say which switch is missing.
        return Err(Error::InvalidConfig(
            "`rediss://` needs TLS support: build redis-rlock with its `tls-rustls` feature".into(),
        ));
    }
    let info = url.into_connection_info().map_err(|e| bad_url(url, e))?;
    if !matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
        if !tls.is_empty() {
            // Certificates with a plain URL would silently mean no TLS at all.
            return Err(Error::InvalidConfig(format!(
                "TLS certificates were given, but `{}` is reached over plain TCP: use a `rediss://` URL",
                info.addr()
            )));
        }
        return redis::Client::open(info).map_err(|e| bad_url(url, e));
    }
    #[cfg(not(feature = "tls-rustls-insecure"))]
    if matches!(
        info.addr(),
        redis::ConnectionAddr::TcpTls { insecure: true, .. }
    ) {
        // Said here, typed, rather than by redis-rs at the first connect.
        return Err(Error::InvalidConfig(format!(
            "`#insecure` (no certificate check) for `{}` needs the `tls-rustls-insecure` feature",
            info.addr()
        )));
    }
    #[cfg(feature = "tls-rustls")]
    ensure_crypto_provider();
    if tls.is_empty() {
        return redis::Client::open(info).map_err(|e| bad_url(url, e));
    }
    with_certificates(info, tls)
}

#[cfg(feature = "tls-rustls")]
fn certificates(tls: &TlsSettings) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: tls
            .client_cert
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.root_cert.clone(),
    }
}

#[cfg(feature = "tls-rustls")]
fn with_certificates(info: redis::ConnectionInfo, tls: &TlsSettings) -> Result<redis::Client> {
    let addr = info.addr().to_string();
    // redis-rs parses the PEM here, so bad certificates show at build, not at connect.
    redis::Client::build_with_tls(info, certificates(tls))
        .map_err(|e| Error::InvalidConfig(format!("TLS certificates for `{addr}`: {e}")))
}

#[cfg(not(feature = "tls-rustls"))]
fn with_certificates(info: redis::ConnectionInfo, _: &TlsSettings) -> Result<redis::Client> {
    Err(Error::InvalidConfig(format!(
        "TLS certificates for `{}` need the `tls-rustls` feature",
        info.addr()
    )))
}

/// redis-rs builds its rustls configurations from the process-wide crypto provider, and
/// rustls only picks one by itself when exactly one provider is compiled in: an
/// application that also links aws-lc-rs (rustls's default) would panic at the first
/// handshake. Installing ring's provider when none is installed yet is what rustls
/// itself would do with ring alone, and leaves an application's own choice alone.
#[cfg(feature = "tls-rustls")]
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: a provider is there either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Whether `e` is a failed TLS handshake or certificate check (rustls's error, which
/// redis-rs hands on wrapped in an I/O error).
#[cfg(feature = "tls-rustls")]
fn is_tls_failure(e: &RedisError) -> bool {
    use std::error::Error as _;
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    let mut next: Option<&(dyn std::error::Error + 'static)> = e.source();
    while let Some(err) = next {
        if err.is::<rustls::Error>() {
            return true;
        }
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if inner.is::<rustls::Error>() {
                return true;
            }
        }
        // An `Arc`'s `source` skips the error it holds, so look inside it first.
        next = match err.downcast_ref::<Shared>() {
            Some(inner) => Some(&**inner),
            None => err.source(),
        };
    }
    false
}

/// Classifies an error met while connecting or on the first command. A failed TLS
/// handshake (an unknown CA, a missing or refused client certificate) will fail the
/// same way on every retry, so it is a configuration error, not an outage.
pub(crate) fn connect_error(e: RedisError, timeout: Duration) -> Error {
    #[cfg(feature = "tls-rustls")]
    if is_tls_failure(&e) {
        return Error::InvalidConfig(format!(
            "TLS handshake with Redis failed (check the CA and client certificate): {e}"
        ));
    }
    Error::from_redis(e, "", timeout)
}

async fn connect_manager(client: redis::Client, config: &Config) -> Result<ConnectionManager> {
    let limit = config.connect_timeout * 2 + config.response_timeout + Duration::from_millis(200);
    tokio::time::timeout(
        limit,
        ConnectionManager::new_with_config(client, manager_config(config)),
    )
    .await
    .map_err(|_| Error::Timeout {
        op: "connect",
        after: config.connect_timeout,
    })?
    .map_err(|e| connect_error(e, config.connect_timeout))
}

/// Builds a cluster client for `nodes`; `push` makes it a RESP3 client whose pushes go
/// to the given channel (used by the pub/sub hub).
pub(crate) fn cluster_client(
    nodes: &[String],
    config: &Config,
    push: Option<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>,
) -> Result<redis::cluster::ClusterClient> {
    for url in nodes {
        open_client(url, &config.tls)?;
    }
    let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(config.connect_timeout)
        .response_timeout(config.response_timeout)
        .retries(3)
        .min_retry_wait(10)
        .max_retry_wait(200);
    // The seeds' scheme (checked above) already turns TLS on for every node the cluster
    // reports; the certificates have to be handed over separately.
    #[cfg(feature = "tls-rustls")]
    if !config.tls.is_empty() {
        builder = builder.certs(certificates(&config.tls));
    }
    if let Some(tx) = push {
        builder = builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(tx);
    }
    builder
        .build()
        .map_err(|e| Error::InvalidConfig(format!("bad cluster configuration: {e}")))
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
                Backend::Single(connect_manager(open_client(url, &config.tls)?, config).await?)
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
                        after: config.connect_timeout,
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
                Backend::Cluster(conn, replicas)
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
            (Backend::Cluster(..), ShardedPubSub::On) => true,
            (Backend::Cluster(c, _), ShardedPubSub::Auto) => {
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
        matches!(*self.backend, Backend::Cluster(..))
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
            Backend::Single(m) => m.clone().send_packed_command(cmd).await,
            Backend::Cluster(c, _) => c.clone().req_packed_command(cmd).await,
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
            Backend::Single(m) => m.clone().send_packed_commands(&pipe, 0, 2).await,
            Backend::Sentinel(s) => {
                // A cached zero may be stale (a fresh master gains replicas within
                // seconds of a failover), so it is checked before WAIT is skipped.
                if s.replicas() == 0 && !self.has_replicas(key).await {
                    return Ok((s.query(cmd).await?, Synced::NotAsked));
                }
                s.query_pipeline(&pipe).await
            }
            Backend::Cluster(c, replicas) => {
                // Two steps, not a pipeline: a pipeline sent to a fixed node does not
                // follow MOVED, and a WAIT after a write-less reply (a busy lock) would
                // only block the node's shared connection. Both go to the slot's master
                // over redis-rs's one connection per node, so WAIT counts the write.
                let reply = self.query(cmd).await?;
                if !wrote(&reply) {
                    return Ok((reply, Synced::NotAsked));
                }
                let slot = key_slot(key);
                if replicas.of(slot) == 0 && !self.has_replicas(key).await {
                    return Ok((reply, Synced::NotAsked));
                }
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                let acked = c
                    .clone()
                    .route_command(wait_cmd, RoutingInfo::SingleNode(route))
                    .await?;
                Ok(vec![reply, acked])
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
            Backend::Single(m) => m.clone().send_packed_command(&role).await,
            Backend::Sentinel(s) => {
                let reply = s.current().manager.clone().send_packed_command(&role).await;
                if let Ok(Some(n)) = reply.as_ref().map(parse_master_role) {
                    s.replicas.store(n, Ordering::Relaxed);
                }
                reply
            }
            Backend::Cluster(c, replicas) => {
                let slot = key_slot(key);
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                let reply = c
                    .clone()
                    .route_command(role, RoutingInfo::SingleNode(route))
                    .await;
                if let Ok(Some(n)) = reply.as_ref().map(parse_master_role) {
                    replicas.per_slot.write()[slot as usize] = n.min(u8::MAX as usize) as u8;
                }
                reply
            }
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

/// True for errors after which the Sentinel master should be looked up again.
fn smells_of_failover(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

/// The master the sentinels currently name, with a connection to it.
pub(crate) struct SentinelMaster {
    sentinels: Vec<redis::Client>,
    master_name: String,
    config: Config,
    current: RwLock<Arc<MasterConn>>,
    replicas: AtomicUsize,
    /// Bumped on every switch, so that the pub/sub hub can move too.
    generation: watch::Sender<u64>,
    /// Asks the follower to check now instead of at its next poll.
    kick: Notify,
}

struct MasterConn {
    addr: (String, u16),
    client: redis::Client,
    manager: ConnectionManager,
}

/// How often the sentinels are asked who the master is (Redisson's `scanInterval`).
const SENTINEL_POLL: Duration = Duration::from_secs(1);

impl SentinelMaster {
    async fn connect(
        urls: &[String],
        master_name: &str,
        config: &Config,
        runtime: &Handle,
        background: &Background,
    ) -> Result<Arc<SentinelMaster>> {
        if urls.is_empty() {
            return Err(Error::InvalidConfig("no sentinel address given".into()));
        }
        if master_name.is_empty() {
            return Err(Error::InvalidConfig("sentinel master name is empty".into()));
        }
        let sentinels = urls
            .iter()
            .map(|u| open_client(u, &config.tls))
            .collect::<Result<Vec<_>>>()?;
        let (addr, replicas) = ask_sentinels(&sentinels, master_name, config).await?;
        let master = open_master(&addr, node_scheme(&sentinels), config).await?;
        let this = Arc::new(SentinelMaster {
            sentinels,
            master_name: master_name.to_string(),
            config: config.clone(),
            current: RwLock::new(Arc::new(master)),
            replicas: AtomicUsize::new(replicas),
            generation: watch::channel(0).0,
            kick: Notify::new(),
        });
        background.service(runtime, follow(Arc::downgrade(&this)));
        Ok(this)
    }

    fn current(&self) -> Arc<MasterConn> {
        self.current.read().clone()
    }

    /// Number of replicas the master had when last asked.
    pub(crate) fn replicas(&self) -> usize {
        self.replicas.load(Ordering::Relaxed)
    }

    /// A client for the current master (the pub/sub hub connects with it).
    pub(crate) fn master_client(&self) -> redis::Client {
        self.current().client.clone()
    }

    /// Changes when the master changes.
    pub(crate) fn generation(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        let master = self.current();
        let reply = master
            .manager
            .clone()
            .send_packed_command(cmd)
            .await
            .and_then(|v| v.extract_error());
        match reply {
            Err(e) if smells_of_failover(&e) => {
                let readonly = e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
                    || e.code() == Some("READONLY");
                if readonly && self.await_switch(&master).await {
                    // A READONLY write did not happen, so it is safe to send again.
                    let master = self.current();
                    return master
                        .manager
                        .clone()
                        .send_packed_command(cmd)
                        .await
                        .and_then(|v| v.extract_error());
                }
                self.kick.notify_one();
                Err(e)
            }
            other => other,
        }
    }

    async fn query_pipeline(&self, pipe: &redis::Pipeline) -> RedisResult<Vec<Value>> {
        let master = self.current();
        let replies = master
            .manager
            .clone()
            .send_packed_commands(pipe, 0, 2)
            .await;
        match &replies {
            Err(e) if smells_of_failover(e) => self.kick.notify_one(),
            Ok(v) => {
                if let Some(Value::ServerError(se)) = v.first() {
                    if se.code() == "READONLY" {
                        self.kick.notify_one();
                    }
                }
            }
            _ => {}
        }
        replies
    }

    /// Asks for a check now and waits up to the response timeout for a new master.
    async fn await_switch(&self, seen: &Arc<MasterConn>) -> bool {
        let mut generation = self.generation();
        self.kick.notify_one();
        let deadline = tokio::time::Instant::now() + self.config.response_timeout;
        loop {
            if !Arc::ptr_eq(&self.current(), seen) {
                return true;
            }
            if tokio::time::timeout_at(deadline, generation.changed())
                .await
                .is_err()
            {
                return false;
            }
        }
    }

    /// One check: who is the master, and how many replicas does it have.
    async fn check(&self) {
        let found = ask_sentinels(&self.sentinels, &self.master_name, &self.config).await;
        let (addr, replicas) = match found {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "no sentinel answered; keeping the current master");
                return;
            }
        };
        self.replicas.store(replicas, Ordering::Relaxed);
        if self.current().addr == addr {
            return;
        }
        match open_master(&addr, node_scheme(&self.sentinels), &self.config).await {
            Ok(master) => {
                tracing::warn!(host = %addr.0, port = addr.1, "sentinel master changed; following");
                *self.current.write() = Arc::new(master);
                self.generation.send_modify(|g| *g += 1);
            }
            Err(e) => tracing::warn!(error = %e, "new master named by sentinels is unreachable"),
        }
    }
}

/// Keeps the master current until the client is dropped.
async fn follow(weak: std::sync::Weak<SentinelMaster>) {
    loop {
        let Some(this) = weak.upgrade() else { return };
        let kicked = async {
            tokio::select! {
                _ = tokio::time::sleep(SENTINEL_POLL) => {}
                _ = this.kick.notified() => {}
            }
        };
        kicked.await;
        this.check().await;
    }
}

/// Asks each sentinel in turn for the master's address, then confirms with the master
/// itself (`ROLE`) that it is one: a sentinel can lag behind a failover.
async fn ask_sentinels(
    sentinels: &[redis::Client],
    name: &str,
    config: &Config,
) -> Result<((String, u16), usize)> {
    let mut last_err = None;
    #[cfg_attr(not(feature = "tls-rustls"), allow(unused_mut))]
    let mut tls_failure: Option<RedisError> = None;
    for sentinel in sentinels {
        let asked = async {
            let mut conn = sentinel.get_multiplexed_async_connection().await?;
            let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(name)
                .query_async(&mut conn)
                .await?;
            let Some(announced) = addr else {
                return Ok(None);
            };
            let addr = config
                .address_map
                .iter()
                .find(|(from, _)| *from == announced)
                .map(|(_, to)| to.clone())
                .unwrap_or(announced);
            let node = node_client(&addr, node_scheme(sentinels), config).map_err(|e| {
                RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "bad master address",
                    e.to_string(),
                ))
            })?;
            let mut node_conn = node.get_multiplexed_async_connection().await?;
            let role: Value = redis::cmd("ROLE").query_async(&mut node_conn).await?;
            Ok::<_, RedisError>(parse_master_role(&role).map(|replicas| (addr, replicas)))
        };
        let limit = config.connect_timeout + config.response_timeout;
        match tokio::time::timeout(limit, asked).await {
            Ok(Ok(Some(found))) => return Ok(found),
            Ok(Ok(None)) => {
                last_err = Some(format!(
                    "sentinel knows no master `{name}`, or it is not a master yet"
                ))
            }
            Ok(Err(e)) => {
                last_err = Some(e.to_string());
                #[cfg(feature = "tls-rustls")]
                if is_tls_failure(&e) {
                    tls_failure = Some(e);
                }
            }
            Err(_) => last_err = Some(format!("no answer within {limit:?}")),
        }
    }
    if let Some(e) = tls_failure {
        // Other sentinels may only have been down; this one says the setup is wrong.
        return Err(connect_error(e, config.connect_timeout));
    }
    Err(Error::Unavailable(RedisError::from((
        ErrorKind::Io,
        "no sentinel named a reachable master",
        last_err.unwrap_or_default(),
    ))))
}

/// `Some(number of replicas)` when a `ROLE` reply says "master".
fn parse_master_role(v: &Value) -> Option<usize> {
    let Value::Array(items) = v else { return None };
    let role = match items.first()? {
        Value::BulkString(b) => b.as_slice(),
        Value::SimpleString(s) => s.as_bytes(),
        _ => return None,
    };
    if role != b"master" {
        return None;
    }
    match items.get(2) {
        Some(Value::Array(replicas)) => Some(replicas.len()),
        _ => Some(0),
    }
}

/// How the nodes a sentinel names are reached: with the first sentinel's scheme, as
/// Redisson does (`rediss://` sentinels serve TLS deployments). The `bool` is
/// `#insecure`.
fn node_scheme(sentinels: &[redis::Client]) -> Option<bool> {
    match sentinels.first().map(|s| s.get_connection_info().addr()) {
        Some(redis::ConnectionAddr::TcpTls { insecure, .. }) => Some(*insecure),
        _ => None,
    }
}

/// A client for a node a sentinel named; `tls` as [`node_scheme`] says.
fn node_client(addr: &(String, u16), tls: Option<bool>, config: &Config) -> Result<redis::Client> {
    let (host, port) = addr;
    let url = match tls {
        None => format!("redis://{host}:{port}/"),
        Some(false) => format!("rediss://{host}:{port}/"),
        Some(true) => format!("rediss://{host}:{port}/#insecure"),
    };
    open_client(&url, &config.tls)
}

async fn open_master(
    addr: &(String, u16),
    tls: Option<bool>,
    config: &Config,
) -> Result<MasterConn> {
    let client = node_client(addr, tls, config)?;
    let manager = connect_manager(client.clone(), config).await?;
    Ok(MasterConn {
        addr: addr.clone(),
        client,
        manager,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid_config(r: Result<redis::Client>) -> String {
        match r {
            Err(Error::InvalidConfig(m)) => m,
            Err(e) => panic!("expected InvalidConfig, got {e:?}"),
            Ok(_) => panic!("expected InvalidConfig, got a client"),
        }
    }

    #[test]
    fn tls_settings_are_checked_against_the_url() {
        let none = TlsSettings::default();
        assert!(open_client("redis://127.0.0.1:6379", &none).is_ok());
        let roots = TlsSettings {
            root_cert: Some(b"anything".to_vec()),
            client_cert: None,
        };
        let m = invalid_config(open_client("redis://127.0.0.1:6379", &roots));
        assert!(m.contains("rediss://"), "{m}");
        #[cfg(not(feature = "tls-rustls"))]
        {
            let m = invalid_config(open_client("REDISS://127.0.0.1:6379", &none));
            assert!(m.contains("tls-rustls"), "{m}");
        }
        #[cfg(all(feature = "tls-rustls", not(feature = "tls-rustls-insecure")))]
        {
            let m = invalid_config(open_client("rediss://127.0.0.1:6379/#insecure", &none));
            assert!(m.contains("tls-rustls-insecure"), "{m}");
        }
    }
}
