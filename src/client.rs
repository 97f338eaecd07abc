//! The client: configuration, the command connection, and the per-client services
//! (watchdog and pub/sub hub) that every lock of the client shares.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, RedisResult, Value};
use tokio::runtime::Handle;
use uuid::Uuid;

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

/// Settings of a [`Client`], fixed when it is built.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) watchdog_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

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
    url: String,
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

    /// Checks the settings, connects, and starts the client's watchdog.
    ///
    /// Must be called inside a tokio runtime (with the time driver enabled). Fails with
    /// [`Error::Unavailable`] or [`Error::Timeout`] when Redis cannot be reached within
    /// the connect timeout.
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
        let redis_client = redis::Client::open(self.url.as_str())
            .map_err(|e| Error::InvalidConfig(format!("bad Redis URL `{}`: {e}", self.url)))?;
        let runtime = Handle::try_current().map_err(|_| {
            Error::InvalidConfig("Client::build must run inside a tokio runtime".into())
        })?;
        let conn = Conn::connect(redis_client.clone(), &config).await?;
        let id = Uuid::new_v4().to_string();
        let watchdog = Watchdog::start(conn.clone(), &config, &runtime);
        let pubsub = PubSubHub::start(redis_client, &config, &runtime);
        let janitor = Janitor::start(conn.clone(), &runtime);
        Ok(Client {
            inner: Arc::new(ClientInner {
                id,
                conn,
                config,
                watchdog,
                pubsub,
                janitor,
                runtime,
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
    pub(crate) runtime: Handle,
}

impl ClientInner {
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
    /// (`redis://[user:password@]host:port[/db]`, or `rediss://` for TLS).
    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder {
            url: url.to_string(),
            config: Config {
                watchdog_timeout: DEFAULT_WATCHDOG_TIMEOUT,
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                response_timeout: DEFAULT_RESPONSE_TIMEOUT,
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

/// The command connection: one multiplexed connection that reconnects by itself.
#[derive(Clone)]
pub(crate) struct Conn {
    manager: ConnectionManager,
    pub(crate) response_timeout: Duration,
}

impl Conn {
    async fn connect(client: redis::Client, config: &Config) -> Result<Conn> {
        // One quick retry only: a request that finds the connection broken waits for the
        // reconnect, and must fail within the configured timeouts, not after a long backoff.
        let mgr_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let limit =
            config.connect_timeout * 2 + config.response_timeout + Duration::from_millis(200);
        let manager = tokio::time::timeout(
            limit,
            ConnectionManager::new_with_config(client, mgr_config),
        )
        .await
        .map_err(|_| Error::Timeout {
            op: "connect",
            after: config.connect_timeout,
        })?
        .map_err(|e| Error::from_redis(e, "", config.connect_timeout))?;
        Ok(Conn {
            manager,
            response_timeout: config.response_timeout,
        })
    }

    /// Sends one command and returns its reply. Bounded without a timer of our own: the
    /// driver enforces the response timeout, and a reconnect is one attempt (two at most)
    /// of at most the connect timeout.
    pub(crate) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        let mut manager = self.manager.clone();
        // Server errors arrive as values; make them errors here, once for all callers.
        manager
            .send_packed_command(cmd)
            .await
            .and_then(|v| v.extract_error())
    }
}
