//! Sentinel: the master the sentinels name, followed across failovers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};
use tokio::runtime::Handle;
use tokio::sync::{watch, Notify};

use super::lanes::Lanes;
use super::named::{named_query, NamedManager};
#[cfg(feature = "tls-rustls")]
use super::open::is_tls_failure;
use super::open::{addr_of, connect_error, connect_manager, open_client, open_lane};
use super::replies::parse_master_role;
use crate::background::Background;
use crate::config::Config;
use crate::error::{Error, Result};

/// True for errors after which the Sentinel master should be looked up again.
pub(super) fn smells_of_failover(e: &RedisError) -> bool {
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
    manager: NamedManager,
    /// Synced writes, each with its `WAIT` on a connection of its own (see
    /// [`super::lanes`]); they go with the master they were opened to.
    lanes: Lanes<MultiplexedConnection>,
}

/// How often the sentinels are asked who the master is (Redisson's `scanInterval`).
const SENTINEL_POLL: Duration = Duration::from_secs(1);

impl SentinelMaster {
    pub(super) async fn connect(
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

    /// The master's address, as an error names it.
    pub(super) fn addr(&self) -> String {
        let current = self.current();
        format!("{}:{}", current.addr.0, current.addr.1)
    }

    /// Number of replicas the master had when last asked.
    /// Asks the current master `ROLE`, keeping the replica count it reports.
    pub(super) async fn ask_role(&self) -> RedisResult<Value> {
        let role = redis::cmd("ROLE");
        let reply = self.current().manager.send(&role).await;
        if let Ok(Some(n)) = reply.as_ref().map(parse_master_role) {
            self.replicas.store(n, Ordering::Relaxed);
        }
        reply
    }

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

    pub(super) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        let master = self.current();
        let reply = master
            .manager
            .send(cmd)
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
                        .send(cmd)
                        .await
                        .and_then(|v| v.extract_error());
                }
                self.kick.notify_one();
                Err(e)
            }
            other => other,
        }
    }

    pub(super) async fn query_pipeline(&self, pipe: &redis::Pipeline) -> RedisResult<Vec<Value>> {
        let master = self.current();
        let replies = async {
            let mut lane = master
                .lanes
                .take(|| open_lane(&master.client, &self.config))
                .await?;
            let replies = lane.conn().send_packed_commands(pipe, 0, 2).await?;
            lane.keep();
            Ok(replies)
        }
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
    // Short-lived as they are, these connections are named too: the one asking the
    // master shows in its `CLIENT LIST` every second.
    let conn_name = config.connection_name();
    for sentinel in sentinels {
        let asked = async {
            let mut conn = sentinel.get_multiplexed_async_connection().await?;
            let ask = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(name)
                .clone();
            let addr: Option<(String, u16)> = redis::from_redis_value(
                named_query(&mut conn, &conn_name, &ask)
                    .await?
                    .extract_error()?,
            )?;
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
            let role = named_query(&mut node_conn, &conn_name, &redis::cmd("ROLE"))
                .await?
                .extract_error()?;
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
        return Err(connect_error(
            e,
            config.connect_timeout,
            &sentinel_addrs(sentinels),
        ));
    }
    Err(Error::Unavailable {
        addr: sentinel_addrs(sentinels),
        source: RedisError::from((
            ErrorKind::Io,
            "no sentinel named a reachable master",
            last_err.unwrap_or_default(),
        )),
    })
}

/// The sentinels, as an error names them while no master is known.
fn sentinel_addrs(sentinels: &[redis::Client]) -> String {
    let addrs: Vec<String> = sentinels.iter().map(addr_of).collect();
    format!("sentinels {}", addrs.join(", "))
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
        lanes: Lanes::new(),
    })
}
