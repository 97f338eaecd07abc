//! The client: configuration, the command connection, and the per-client services
//! (watchdog and pub/sub hub) that every lock of the client shares.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use uuid::Uuid;

use crate::connection::{connect_error, open_client, Conn};
use crate::error::{Error, Result};
use crate::janitor::Janitor;
use crate::lock::{check_duration, Lock};
use crate::pubsub::PubSubHub;
use crate::watchdog::Watchdog;

/// Default lease of a watchdog-renewed lock, as in Redisson (`lockWatchdogTimeout`).
pub const DEFAULT_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time allowed to open a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time allowed for Redis to answer one command, as in Redisson (`timeout`).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);

/// Which Redis deployment a client talks to. Chosen by configuration only: the lock API
/// is the same on all of them.
///
/// ```no_run
/// # async fn demo() -> redis_rlock::Result<()> {
/// use redis_rlock::{Client, Deployment};
/// let client = Client::with_deployment(Deployment::Sentinel {
///     sentinels: vec!["redis://127.0.0.1:26379".into(), "redis://127.0.0.1:26380".into()],
///     master_name: "mymaster".into(),
/// })
/// .build()
/// .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Deployment {
    /// One server (`redis://[user:password@]host:port[/db]`, or `rediss://` for TLS with
    /// the `tls-rustls` feature).
    Single {
        /// The server's URL.
        url: String,
    },
    /// A master found through Redis Sentinel, followed across failovers.
    Sentinel {
        /// URLs of the sentinels (`redis://host:port`); asked in order. The master and
        /// its replicas are reached with the first sentinel's scheme: `rediss://`
        /// sentinels mean TLS to the master too (as Redisson does).
        sentinels: Vec<String>,
        /// The name the sentinels monitor the master under.
        master_name: String,
    },
    /// A Redis Cluster, reached through any of these seed nodes.
    Cluster {
        /// URLs of one or more cluster nodes.
        nodes: Vec<String>,
    },
}

/// Whether writes wait for replicas (Redisson's `checkLockSyncedSlaves`).
///
/// With `Wait`, every acquire, unlock and renewal is followed, in the same pipeline on
/// the same connection, by `WAIT acks timeout`. An acquisition that no replica
/// acknowledged is rolled back, so that a failover cannot hand the lock to a second
/// holder; then it is retried or fails with [`Error::NotReplicated`], as
/// [`SyncFailure`] says. On by default for Sentinel and Cluster, off for a single
/// server.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplicaSync {
    /// No `WAIT` is ever sent (for servers without replicas or without `WAIT`).
    Off,
    /// `WAIT` after each write.
    Wait {
        /// How long `WAIT` may block. Default 1 s.
        timeout: Duration,
        /// How many replicas `WAIT` asks for; it returns early once that many
        /// acknowledged. Default 1. Zero acknowledgements always count as a failure.
        acks: u32,
        /// What to do when no replica acknowledged an acquisition.
        on_failure: SyncFailure,
    },
}

impl ReplicaSync {
    /// `WAIT 1 1000`, retrying a rolled-back acquisition up to 3 times.
    pub fn default_wait() -> ReplicaSync {
        ReplicaSync::Wait {
            timeout: Duration::from_secs(1),
            acks: 1,
            on_failure: SyncFailure::Retry { attempts: 3 },
        }
    }
}

/// What an acquisition that reached no replica does after it is rolled back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SyncFailure {
    /// Fail at once with [`Error::NotReplicated`].
    Fail,
    /// Try again, up to `attempts` more times, then fail with [`Error::NotReplicated`].
    Retry {
        /// Further attempts after the first.
        attempts: u32,
    },
}

/// Whether a cluster client uses sharded pub/sub (`SSUBSCRIBE`/`SPUBLISH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ShardedPubSub {
    /// Use it when the cluster answers `PUBSUB SHARDNUMSUB` (Redis 7 and later).
    #[default]
    Auto,
    /// Always use it.
    On,
    /// Never: classic `PUBLISH`, which every node broadcasts to the whole cluster.
    Off,
}

/// Settings of a [`Client`], fixed when it is built.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) watchdog_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// `None`: the deployment's default.
    pub(crate) replica_sync: Option<ReplicaSync>,
    pub(crate) sharded_pubsub: ShardedPubSub,
    pub(crate) retry_window: Duration,
    pub(crate) handover_limit: u32,
    pub(crate) handover_window: Duration,
    /// Addresses announced by sentinels, mapped to where this client reaches them.
    pub(crate) address_map: Vec<((String, u16), (String, u16))>,
    pub(crate) tls: TlsSettings,
}

/// Certificates for `rediss://` connections, applied to every connection a client opens.
/// Empty unless a TLS feature is on and the builder was given some.
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    /// PEM; when set, the only CAs trusted (instead of the system's).
    pub(crate) root_cert: Option<Vec<u8>>,
    /// PEM certificate chain and private key for mutual TLS.
    pub(crate) client_cert: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsSettings {
    pub(crate) fn is_empty(&self) -> bool {
        self.root_cert.is_none() && self.client_cert.is_none()
    }
}

// Certificates are public, but the key is not; neither is worth a page of bytes in a log.
impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("root_cert", &self.root_cert.as_ref().map(|_| "<pem>"))
            .field(
                "client_cert",
                &self.client_cert.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Default time a waiting task keeps retrying through errors such as a failover.
pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(10);

/// Builds a [`Client`] with non-default settings.
///
/// ```no_run
/// # async fn demo() -> redis_rlock::Result<()> {
/// use std::time::Duration;
/// let client = redis_rlock::Client::builder("redis://127.0.0.1:6379")
///     .watchdog_timeout(Duration::from_secs(10))
///     .response_timeout(Duration::from_secs(1))
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    deployment: Deployment,
    config: Config,
}

impl ClientBuilder {
    /// The lease of locks taken without an explicit lease. The watchdog renews them every
    /// third of it while they are held. Default 30 s.
    pub fn watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.config.watchdog_timeout = timeout;
        self
    }

    /// The time allowed to open a connection (commands and pub/sub). Default 5 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// The time allowed for Redis to answer one command. Default 3 s.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.config.response_timeout = timeout;
        self
    }

    /// Replica sync after writes. Default: [`ReplicaSync::default_wait`] for Sentinel
    /// and Cluster, [`ReplicaSync::Off`] for a single server.
    pub fn replica_sync(mut self, sync: ReplicaSync) -> Self {
        self.config.replica_sync = Some(sync);
        self
    }

    /// Sharded pub/sub on a cluster. Default [`ShardedPubSub::Auto`]; ignored elsewhere.
    pub fn sharded_pubsub(mut self, mode: ShardedPubSub) -> Self {
        self.config.sharded_pubsub = mode;
        self
    }

    /// Reaches a node that the sentinels announce as `from` at `to` instead, for
    /// clients behind NAT or port mapping (Redisson's `natMapper`). May be given more
    /// than once.
    pub fn map_address(mut self, from: (&str, u16), to: (&str, u16)) -> Self {
        self.config
            .address_map
            .push(((from.0.to_string(), from.1), (to.0.to_string(), to.1)));
        self
    }

    /// How long a task that is already waiting for a lock keeps retrying through
    /// transient errors (a failover, a reconnect) before it gives up with the error.
    /// Default 10 s. The first attempt of a call never retries this way: it reports
    /// an unreachable Redis at once.
    pub fn retry_window(mut self, window: Duration) -> Self {
        self.config.retry_window = window;
        self
    }

    /// How many times in a row a released lock may be handed straight to a task of this
    /// client that waits for it, before a release is published to every waiter again.
    /// Default [`DEFAULT_HANDOVER_LIMIT`](crate::DEFAULT_HANDOVER_LIMIT); 0 turns
    /// hand-over off.
    ///
    /// A hand-over saves the waiter its wake-up message and its acquire: the unlock
    /// script writes the waiter's field and the unlock's reply is the grant. Among this
    /// client's waiters it goes oldest first. The limit, with
    /// [`handover_window`](Self::handover_window), is what keeps waiters of other
    /// clients, which only hear published releases, from starving. Hand-over is not
    /// used with [`ReplicaSync::Wait`] (the default on Sentinel and Cluster), where a
    /// grant would need a replica's acknowledgement.
    pub fn handover_limit(mut self, limit: u32) -> Self {
        self.config.handover_limit = limit;
        self
    }

    /// How long a run of hand-overs on one name may last, counted from its first; the
    /// first release after that is published. Default
    /// [`DEFAULT_HANDOVER_WINDOW`](crate::DEFAULT_HANDOVER_WINDOW). Together with
    /// [`handover_limit`](Self::handover_limit) it bounds how long waiters of other
    /// clients wait behind this client's tasks: with locks held for milliseconds the
    /// window ends a run after a few hand-overs; with locks held for microseconds the
    /// count does.
    pub fn handover_window(mut self, window: Duration) -> Self {
        self.config.handover_window = window;
        self
    }

    /// Trusts the CA certificates in `pem` (PEM, one or more) for `rediss://`
    /// connections, instead of the system's trust store. Certificates given in several
    /// calls are all trusted. Applies to every connection of the client: commands,
    /// pub/sub, sentinels and the master they name, and every cluster node.
    ///
    /// Needs the `tls-rustls` feature. The server's certificate must name the host of
    /// the URL (a DNS name, or an IP address SAN for `rediss://127.0.0.1`).
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) fails with [`Error::InvalidConfig`] when `pem` holds no
    /// usable certificate, when a URL of the client is not `rediss://`, or when the
    /// server's certificate is not signed by these CAs.
    #[cfg(feature = "tls-rustls")]
    pub fn tls_root_cert(mut self, pem: impl AsRef<[u8]>) -> Self {
        let roots = self.config.tls.root_cert.get_or_insert_with(Vec::new);
        roots.extend_from_slice(pem.as_ref());
        // PEM blocks must start on a line of their own.
        roots.push(b'\n');
        self
    }

    /// Presents this certificate (PEM, the chain from the client's own certificate
    /// up) and private key (PEM: PKCS#8, PKCS#1 or SEC1) to servers that ask for
    /// one (`tls-auth-clients yes`): mutual TLS. Replaces an earlier pair. Applies to
    /// every connection of the client, as [`tls_root_cert`](Self::tls_root_cert) does.
    ///
    /// Needs the `tls-rustls` feature.
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) fails with [`Error::InvalidConfig`] when the certificate
    /// or key cannot be read or do not belong together, when a URL of the client is not
    /// `rediss://`, or when the server refuses the certificate.
    #[cfg(feature = "tls-rustls")]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Self {
        self.config.tls.client_cert = Some((cert_pem.as_ref().to_vec(), key_pem.as_ref().to_vec()));
        self
    }

    /// Checks the settings, connects, and starts the client's watchdog.
    ///
    /// Must be called inside a tokio runtime (with the time driver enabled). Sends one
    /// `PING` to check that Redis accepts this client.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`], [`Error::DurationOutOfRange`]: a setting or URL is
    ///   unusable, or there is no tokio runtime. Also for TLS that cannot work: a
    ///   `rediss://` URL without a TLS feature, certificates that do not parse, or a
    ///   handshake the server's certificate (or this client's, under mutual TLS) fails.
    /// - [`Error::AuthFailed`]: Redis refused the credentials (none given where a
    ///   password is required, a wrong user or password).
    /// - [`Error::Unavailable`] or [`Error::Timeout`]: Redis cannot be reached within
    ///   the connect timeout.
    pub async fn build(self) -> Result<Client> {
        let config = self.config;
        check_duration("watchdog timeout", config.watchdog_timeout)?;
        if config.watchdog_timeout < Duration::from_millis(30) {
            return Err(Error::InvalidConfig(format!(
                "watchdog timeout {:?} is below 30 ms; renewals every third of it would flood Redis",
                config.watchdog_timeout
            )));
        }
        for (what, d) in [
            ("connect timeout", config.connect_timeout),
            ("response timeout", config.response_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::InvalidConfig(format!("{what} is zero")));
            }
            check_duration(what, d)?;
        }
        check_duration("retry window", config.retry_window)?;
        check_duration("hand-over window", config.handover_window)?;
        if let Some(ReplicaSync::Wait { timeout, acks, .. }) = &config.replica_sync {
            if timeout.is_zero() || *acks == 0 {
                return Err(Error::InvalidConfig(
                    "replica sync needs a non-zero timeout and at least one ack (use ReplicaSync::Off to turn it off)".into(),
                ));
            }
            check_duration("replica sync timeout", *timeout)?;
        }
        match &self.deployment {
            Deployment::Single { url } => {
                open_client(url, &config.tls)?;
            }
            Deployment::Sentinel { sentinels, .. } if sentinels.is_empty() => {
                return Err(Error::InvalidConfig("no sentinel address given".into()))
            }
            Deployment::Cluster { nodes } if nodes.is_empty() => {
                return Err(Error::InvalidConfig("no cluster node address given".into()))
            }
            _ => {}
        }
        let runtime = Handle::try_current().map_err(|_| {
            Error::InvalidConfig("Client::build must run inside a tokio runtime".into())
        })?;
        let conn = Conn::connect(&self.deployment, &config, &runtime).await?;
        // A connection may open and still have every command refused (no password where
        // one is required): ask once, so that it shows here, typed, not at the first lock.
        // A user whose ACL lacks PING is authenticated all the same.
        match conn.query(&redis::cmd("PING")).await {
            Ok(_) => {}
            Err(e) => match connect_error(e, config.response_timeout) {
                Error::PermissionDenied { .. } => {}
                e => return Err(e),
            },
        }
        let id = Uuid::new_v4().to_string();
        let watchdog = Watchdog::start(conn.clone(), &config, &runtime);
        let pubsub = PubSubHub::start(&self.deployment, &conn, &config, &runtime).await?;
        let janitor = Janitor::start(conn.clone(), &runtime);
        let handover = Arc::new(crate::handover::Handover::new(
            config.handover_limit,
            config.handover_window,
        ));
        Ok(Client {
            inner: Arc::new(ClientInner {
                id,
                conn,
                config,
                watchdog,
                pubsub,
                janitor,
                fixed: Default::default(),
                handover,
                inflight: Default::default(),
            }),
        })
    }
}

/// A connection to one Redis deployment, shared by all locks made from it.
///
/// A client has one multiplexed command connection (reconnected on failure), one
/// pub/sub connection opened when the first waiter needs it, and one watchdog timer.
/// It is cheap to clone; clones share all of that. The watchdog stops when the last
/// clone and the last guard are dropped; locks still held then expire after their lease.
///
/// Its background work (the watchdog, releases of dropped guards) runs on the runtime the
/// client was built in. If that runtime shuts down while the client is still used from
/// another one, every lock held at that moment is reported lost at once (no renewal can
/// happen), and the next lock taken moves the watchdog to the runtime it runs on. Waiters
/// of a client whose pub/sub task went with the old runtime wake by the holder's TTL.
///
/// ```no_run
/// # async fn demo() -> redis_rlock::Result<()> {
/// let client = redis_rlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let lock = client.lock("orders:42");
/// let guard = lock.lock().await?;
/// // ... critical section ...
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub(crate) id: String,
    pub(crate) conn: Conn,
    pub(crate) config: Config,
    pub(crate) watchdog: Watchdog,
    pub(crate) pubsub: PubSubHub,
    pub(crate) janitor: Janitor,
    pub(crate) fixed: crate::lock::FixedHolds,
    pub(crate) handover: Arc<crate::handover::Handover>,
    pub(crate) inflight: Arc<crate::inflight::InFlight>,
}

impl ClientInner {
    /// Whether releases may be handed to this client's waiters (see
    /// [`ClientBuilder::handover_limit`]). With replica sync a grant would need the
    /// acknowledgement an acquire gets; there every release is published.
    /// How long one acquire or unlock may take, retries and reconnects included, and a
    /// little more: how long an offered waiter waits for the unlock carrying its offer,
    /// and a request waits for earlier ones of the same holder field.
    pub(crate) fn offer_bound(&self) -> Duration {
        (self.config.response_timeout + self.config.connect_timeout) * 3
            + Duration::from_millis(100)
    }

    /// The runtime for this client's background work (see [`Watchdog::home`]).
    pub(crate) fn runtime(&self) -> Handle {
        self.watchdog.home()
    }

    pub(crate) fn hands_over(&self) -> bool {
        self.config.handover_limit > 0 && matches!(self.conn.sync(), ReplicaSync::Off)
    }

    /// How long a request latch is kept: long enough to outlive every retry of its
    /// request, short enough not to pile up.
    pub(crate) fn latch_ttl(&self) -> Duration {
        // Capped so that absurd timeouts cannot push PX past Redis's range.
        ((self.config.response_timeout + self.config.connect_timeout) * 4)
            .min(Duration::from_secs(24 * 3600))
    }
}

impl Client {
    /// Connects with default settings. See [`ClientBuilder::build`].
    pub async fn connect(url: &str) -> Result<Client> {
        Client::builder(url).build().await
    }

    /// Starts a builder for a client of the Redis server at `url`
    /// (`redis://[user:password@]host:port[/db]`, or `rediss://` for TLS with the
    /// `tls-rustls` feature and `ClientBuilder::tls_root_cert`).
    pub fn builder(url: &str) -> ClientBuilder {
        Client::with_deployment(Deployment::Single {
            url: url.to_string(),
        })
    }

    /// Starts a builder for a master monitored by Redis Sentinel under `master_name`.
    pub fn sentinel<S: AsRef<str>>(sentinels: &[S], master_name: &str) -> ClientBuilder {
        Client::with_deployment(Deployment::Sentinel {
            sentinels: sentinels.iter().map(|s| s.as_ref().to_string()).collect(),
            master_name: master_name.to_string(),
        })
    }

    /// Starts a builder for a Redis Cluster reached through `nodes`.
    pub fn cluster<S: AsRef<str>>(nodes: &[S]) -> ClientBuilder {
        Client::with_deployment(Deployment::Cluster {
            nodes: nodes.iter().map(|s| s.as_ref().to_string()).collect(),
        })
    }

    /// Starts a builder for any [`Deployment`].
    pub fn with_deployment(deployment: Deployment) -> ClientBuilder {
        ClientBuilder {
            deployment,
            config: Config {
                watchdog_timeout: DEFAULT_WATCHDOG_TIMEOUT,
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                response_timeout: DEFAULT_RESPONSE_TIMEOUT,
                replica_sync: None,
                sharded_pubsub: ShardedPubSub::Auto,
                retry_window: DEFAULT_RETRY_WINDOW,
                handover_limit: crate::handover::DEFAULT_HANDOVER_LIMIT,
                handover_window: crate::handover::DEFAULT_HANDOVER_WINDOW,
                address_map: Vec::new(),
                tls: TlsSettings::default(),
            },
        }
    }

    /// A handle to the lock named `name`. Nothing is sent to Redis until it is used;
    /// the name is checked then.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.clone(), name.into())
    }

    /// This client's UUID, the first half of every holder field it writes.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The lease of watchdog-renewed locks.
    pub fn watchdog_timeout(&self) -> Duration {
        self.inner.config.watchdog_timeout
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.inner.id)
            .field("config", &self.inner.config)
            .finish()
    }
}
