//! The public client: building it (checking the settings of its [`ClientBuilder`] and
//! wiring the shared services together), the facade over those services, and shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use uuid::Uuid;

pub use crate::api::builder::ClientBuilder;
use crate::api::latch::CountDownLatch;
use crate::api::lock::Lock;
use crate::api::permits::PermitExpirableSemaphore;
use crate::api::semaphore::Semaphore;
use crate::background::{Background, Signal};
use crate::config::{check_client_name, check_duration, Config, TlsSettings};
pub use crate::config::{
    Deployment, ReplicaSync, ShardedPubSub, SyncFailure, DEFAULT_CLIENT_NAME,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_FAIR_LOCK_WAIT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT,
    DEFAULT_RETRY_WINDOW, DEFAULT_TURN_WINDOW, DEFAULT_WATCHDOG_TIMEOUT,
};
use crate::error::{Error, Result};
use crate::identity::Kind;
use crate::policy::run::Limits;
use crate::shell::services::ClientInner;
use crate::shell::watchdog::Watchdog;
use crate::state::Core;
use crate::stats::{Counters, Stats};
use crate::wire::connection::{connect_error, open_client, Conn};
use crate::wire::janitor::Janitor;
use crate::wire::pubsub::PubSubHub;

impl ClientBuilder {
    /// Checks the settings, connects, and starts the client's watchdog.
    ///
    /// Must be called inside a tokio runtime (with the time driver enabled). Sends one
    /// `PING` to check that Redis accepts this client.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`], [`Error::DurationOutOfRange`]: a setting or URL is
    ///   unusable, or there is no tokio runtime. Also for TLS that cannot work: a
    ///   `rediss://` (or `valkeys://`) URL without a TLS feature, certificates that do not parse, or a
    ///   handshake the server's certificate (or this client's, under mutual TLS) fails.
    /// - [`Error::AuthFailed`]: Redis refused the credentials (none given where a
    ///   password is required, a wrong user or password).
    /// - [`Error::Unavailable`] (naming the address it tried) or [`Error::Timeout`]:
    ///   Redis cannot be reached within the connect timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a future dropped before it returns leaves no client; the services
    /// it started stop, and its connections close.
    pub async fn build(self) -> Result<Client> {
        let mut config = self.config;
        check_client_name(&config.name)?;
        check_duration("watchdog timeout", config.watchdog_timeout)?;
        if config.watchdog_timeout < Duration::from_millis(30) {
            return Err(Error::InvalidConfig(format!(
                "watchdog timeout {:?} is below 30 ms; renewals every third of it would flood Redis",
                config.watchdog_timeout
            )));
        }
        config.watchdog_timeout = crate::config::whole_ms(config.watchdog_timeout);
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
        check_duration("turn window", config.turn_window)?;
        let (least, most) = crate::config::FAIR_WAIT_RANGE;
        if !(least..=most).contains(&config.fair_lock_wait_timeout) {
            return Err(Error::InvalidConfig(format!(
                "fair lock wait timeout {:?} is outside {least:?}..={most:?}",
                config.fair_lock_wait_timeout
            )));
        }
        if let Some(ReplicaSync::Wait { timeout, acks, .. }) = &config.replica_sync {
            if timeout.is_zero() || *acks == 0 {
                return Err(Error::InvalidConfig(
                    "replica sync needs a non-zero timeout and at least one ack (use ReplicaSync::Off to turn it off)".into(),
                ));
            }
            check_duration("replica sync timeout", *timeout)?;
        }
        let wait = match (&config.replica_sync, &self.deployment) {
            (Some(ReplicaSync::Wait { timeout, .. }), _) => Some(*timeout),
            (None, Deployment::Single { .. }) | (Some(ReplicaSync::Off), _) => None,
            // Sentinel and Cluster sync by default.
            #[allow(unreachable_patterns)]
            (None, _) => match ReplicaSync::default_wait() {
                ReplicaSync::Wait { timeout, .. } => Some(timeout),
                ReplicaSync::Off => None,
            },
        };
        if let Some(wait) = wait.filter(|w| *w >= config.watchdog_timeout / 3) {
            // WAIT blocks the connection it runs on, renewals queued behind it included.
            tracing::warn!(?wait, watchdog_timeout = ?config.watchdog_timeout, "the replica sync timeout is not below a third of the watchdog timeout: replicas that do not answer can hold renewals up until leases run out");
        }
        match &self.deployment {
            Deployment::Single { url } if config.redis_client.is_none() => {
                open_client(url, &config.tls)?;
            }
            #[cfg(feature = "sentinel")]
            Deployment::Sentinel { sentinels, .. } if sentinels.is_empty() => {
                return Err(Error::InvalidConfig("no sentinel address given".into()))
            }
            #[cfg(feature = "cluster")]
            Deployment::Cluster { nodes } if nodes.is_empty() => {
                return Err(Error::InvalidConfig("no cluster node address given".into()))
            }
            _ => {}
        }
        let runtime = Handle::try_current().map_err(|_| {
            Error::InvalidConfig("Client::build must run inside a tokio runtime".into())
        })?;
        let background = Arc::new(Background::default());
        // Services started before a failure below must not outlive the failed build.
        let started = StopOnDrop(Some(background.clone()));
        // Drawn before connecting: every connection is named with it.
        config.id = Uuid::new_v4().to_string();
        let conn = Conn::connect(&self.deployment, &config, &runtime, &background).await?;
        // A connection may open and still have every command refused (no password where
        // one is required): ask once, so that it shows here, typed, not at the first lock.
        // A user whose ACL lacks PING is authenticated all the same.
        match conn.query(&redis::cmd("PING")).await {
            Ok(_) => {}
            Err(e) => match connect_error(e, config.response_timeout, &conn.addr()) {
                Error::PermissionDenied { .. } => {}
                e => return Err(e),
            },
        }
        let id = config.id.clone();
        let core = Arc::new(Core::new(
            config.watchdog_timeout,
            Limits {
                limit: config.handover_limit,
                window: config.handover_window,
                asks_at_end: crate::shell::services::runs_past_window(&conn),
            },
        ));
        let stats = Arc::new(Counters::default());
        let watchdog = Watchdog::start(
            conn.clone(),
            &config,
            &runtime,
            &background,
            core.clone(),
            stats.clone(),
        );
        let pubsub = PubSubHub::start(
            &self.deployment,
            &conn,
            &config,
            &runtime,
            &background,
            stats.clone(),
            id.as_str().into(),
        )
        .await?;
        let janitor = Janitor::start(conn.clone(), &runtime, &background);
        started.disarm();
        Ok(Client {
            inner: Arc::new(ClientInner {
                id,
                conn,
                config,
                watchdog,
                pubsub,
                janitor,
                core,
                stats,
                background,
                closed: Signal::default(),
            }),
        })
    }
}

/// Stops the services of a client whose build failed.
struct StopOnDrop(Option<Arc<Background>>);

impl StopOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(background) = &self.0 {
            background.stop_services();
        }
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

impl Client {
    /// Connects with default settings. See [`ClientBuilder::build`].
    ///
    /// # Errors
    ///
    /// As [`ClientBuilder::build`]: an unusable URL, refused credentials, or Redis out
    /// of reach within the connect timeout.
    ///
    /// # Cancel safety
    ///
    /// As [`ClientBuilder::build`].
    pub async fn connect(url: impl AsRef<str>) -> Result<Client> {
        Client::builder(url).build().await
    }

    /// Starts a builder for a client of the Redis server at `url`
    /// (`redis://[user:password@]host:port[/db]`, or `rediss://` for TLS with the
    /// `tls-rustls` feature and `ClientBuilder::tls_root_cert`). `valkey://` and
    /// `valkeys://` are the same as `redis://` and `rediss://`, here and in the URL lists
    /// of [`sentinel`](Self::sentinel) and [`cluster`](Self::cluster).
    pub fn builder(url: impl AsRef<str>) -> ClientBuilder {
        Client::with_deployment(Deployment::Single {
            url: url.as_ref().to_string(),
        })
    }

    /// Starts a builder over a redis-rs client the caller already has: its address,
    /// database, credentials and TLS setup are used as they are, for the command and the
    /// pub/sub connections of a single server. (`redis` is re-exported as
    /// [`redis_rlock::redis`](crate::redis), so no version needs pinning.)
    ///
    /// ```no_run
    /// # async fn demo() -> redis_rlock::Result<()> {
    /// use redis_rlock::{redis, Client};
    /// let existing = redis::Client::open("redis://127.0.0.1:6379").expect("a valid URL");
    /// let client = Client::from_redis_client(existing).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn from_redis_client(client: redis::Client) -> ClientBuilder {
        let url = client.get_connection_info().addr().to_string();
        let mut builder = Client::with_deployment(Deployment::Single { url });
        builder.config.redis_client = Some(client);
        builder
    }

    /// Starts a builder for a master monitored by Redis Sentinel under `master_name`
    /// (feature `sentinel`, on by default).
    #[cfg(feature = "sentinel")]
    pub fn sentinel<S: AsRef<str>>(sentinels: &[S], master_name: &str) -> ClientBuilder {
        Client::with_deployment(Deployment::Sentinel {
            sentinels: sentinels.iter().map(|s| s.as_ref().to_string()).collect(),
            master_name: master_name.to_string(),
        })
    }

    /// Starts a builder for a Redis Cluster reached through `nodes` (feature `cluster`,
    /// on by default).
    #[cfg(feature = "cluster")]
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
                handover_limit: crate::state::DEFAULT_HANDOVER_LIMIT,
                handover_window: crate::state::DEFAULT_HANDOVER_WINDOW,
                turn_window: crate::config::DEFAULT_TURN_WINDOW,
                fair_lock_wait_timeout: crate::config::DEFAULT_FAIR_LOCK_WAIT_TIMEOUT,
                address_map: Vec::new(),
                tls: TlsSettings::default(),
                redis_client: None,
                name: DEFAULT_CLIENT_NAME.to_string(),
                id: String::new(),
            },
        }
    }

    /// A handle to the lock named `name`, written as Redisson's `RLock` writes it: the
    /// lock hash and its channel, and no token counter (short-lived request latches
    /// aside, `docs/protocol.md` 1.5). Nothing is sent to Redis until
    /// it is used; the name is checked then. Its guards carry no fencing token; use
    /// [`fenced_lock`](Self::fenced_lock) for one.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.inner.clone(), name.into(), false, Kind::Plain)
    }

    /// A handle to the fenced lock named `name`, in Redisson's `RFencedLock` layout: the
    /// same lock hash and channel as [`lock`](Self::lock) (the two exclude each other),
    /// plus the counter `redisson_lock_token:{<name>}`, which every acquisition, a
    /// re-entry included, increments inside the acquire script. Every guard carries its
    /// own token ([`LockGuard::fencing_token`]); a re-entry therefore goes to Redis
    /// rather than being served locally. The counter never expires: one key per name
    /// stays in Redis, as with Redisson.
    ///
    /// [`LockGuard::fencing_token`]: crate::LockGuard::fencing_token
    pub fn fenced_lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.inner.clone(), name.into(), true, Kind::Plain)
    }

    /// A handle to the fair lock named `name`, in Redisson's `RFairLock` layout: the
    /// lock hash `<name>` (so it excludes [`lock`](Self::lock) on the same name), a queue
    /// `redisson_lock_queue:{<name>}` and waiter deadlines `redisson_lock_timeout:{<name>}`.
    /// Waiters take it in the order they first waited, across clients, processes and
    /// Redisson; each hears on a channel of its own when it is first in line. The same
    /// methods as any [`Lock`]: re-entry, the watchdog, leases, `try_lock_for`.
    ///
    /// Deadlines in the queue follow Redisson's arithmetic with the client's
    /// [wait timeout](crate::ClientBuilder::fair_lock_wait_timeout) (Redisson's
    /// `fairLockWaitTimeout`, 300 s by default; set it to the Java side's value): a
    /// waiter joins with the deadline of the one before it plus the wait timeout, and
    /// each grant takes the wait timeout off every other deadline. Whoever takes the lock,
    /// a waiter of this crate or of Redisson, the others keep their places.
    ///
    /// A waiting task asks Redis again at least every third of the wait timeout (and at
    /// least every 5/3 s), and each time raises its deadline to at least now + the wait
    /// timeout per place from the head: a live waiter is never purged as dead however
    /// long it waits, as long as each Redisson client waits with `lock()` or with a
    /// `tryLock` wait no longer than its `fairLockWaitTimeout` (a longer one takes that
    /// much off every deadline when it is granted). One that stops asking (crashed, or
    /// paused for longer than the wait timeout) is passed over at its deadline: once it
    /// is first in line, at most the wait timeout after its last attempt or the deadline
    /// it joined with, whichever is later (`docs/protocol.md` 8.4 has the exact bound);
    /// if it comes back, it joins at the end. A waiter that gives up (out of time, or its future dropped) leaves the
    /// queue at once. `try_lock` (no wait) never joins the queue.
    pub fn fair_lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.inner.clone(), name.into(), false, Kind::Fair)
    }

    /// A handle to the semaphore named `name`, in Redisson's `RSemaphore` layout (the
    /// key `<name>` holds the available permits; channel `redisson_sc:{<name>}`). Nothing
    /// is sent until it is used; the name is checked then.
    pub fn semaphore(&self, name: impl Into<String>) -> Semaphore {
        Semaphore::new(self.inner.clone(), name.into())
    }

    /// A handle to the permit-expirable semaphore named `name`, in Redisson's
    /// `RPermitExpirableSemaphore` layout (the count at `<name>`, the leases in
    /// `{<name>}:timeout`, channel `redisson_sc:{<name>}`). Nothing is sent until it is
    /// used.
    pub fn permit_expirable_semaphore(&self, name: impl Into<String>) -> PermitExpirableSemaphore {
        PermitExpirableSemaphore::new(self.inner.clone(), name.into())
    }

    /// A handle to the count-down latch named `name`, in Redisson's `RCountDownLatch`
    /// layout (the count at `<name>`, channel
    /// `redisson_countdownlatch__channel__{<name>}`). Nothing is sent until it is used.
    pub fn count_down_latch(&self, name: impl Into<String>) -> CountDownLatch {
        CountDownLatch::new(self.inner.clone(), name.into())
    }

    /// What this client has done since it was built: locks taken, busy replies,
    /// releases, renewals and their failures, leases lost, hand-overs, wake-ups and
    /// pub/sub connections. Reading it costs a few atomic loads; nothing is sent. With
    /// the `metrics` feature the same events also go to the `metrics` facade.
    pub fn stats(&self) -> Stats {
        self.inner.stats.snapshot()
    }

    /// This client's UUID, the first half of every holder field it writes.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The lease of watchdog-renewed locks.
    pub fn watchdog_timeout(&self) -> Duration {
        self.inner.config.watchdog_timeout
    }

    /// Shuts the client down, for a service that stops: after it, no lock of this
    /// client is left held in Redis and no task of the client runs.
    ///
    /// In order: new acquisitions fail with [`Error::Closed`], and so do waiting ones,
    /// at once; every hold the client still has (held guards, watchdog or fixed lease)
    /// is released in Redis, waking other clients' waiters, and so are the permits of
    /// live permit guards ([`SemaphorePermit`](crate::SemaphorePermit),
    /// [`PermitGuard`](crate::PermitGuard)); releases of dropped guards
    /// and requests still finishing in the background are waited for; pending request
    /// latches queued for deletion are deleted; then the watchdog, the pub/sub connection
    /// and every other task of the client stop. Guards still alive report
    /// [`LockGuard::is_lost`] (their lock was released), and their `unlock()` and every
    /// method of the client's locks answer [`Error::Closed`]. The command connection's
    /// own driver task (redis-rs's) ends when the last handle of the client is dropped.
    /// A latch whose request never got an answer is not known to be there; it expires by
    /// its TTL.
    ///
    /// Clones of the client are shut down with it. Calling it again does the remaining
    /// work again and returns.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] if all that took longer than one request's worth of timeouts
    /// and retries (3 x (response + connect timeout) + 100 ms); the first error of a
    /// release that could not be confirmed (every one is logged). Whatever was not
    /// released expires with its lease; the client is closed and stopped either way.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the client closed; releases already sent finish in
    /// the background, and the tasks it did not stop yet stop when the last handle of
    /// the client is dropped.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    ///
    /// [`LockGuard::is_lost`]: crate::LockGuard::is_lost
    pub async fn shutdown(&self) -> Result<()> {
        crate::shell::release::shut_down(&self.inner).await
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
