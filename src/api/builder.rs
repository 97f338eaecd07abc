//! `ClientBuilder`: a client's settings, set one by one before it connects. What
//! [`build`](ClientBuilder::build) does with them is in `client.rs`.

use std::time::Duration;

use crate::config::{Config, Deployment, ReplicaSync, ShardedPubSub};

/// Builds a [`Client`](crate::Client) with non-default settings.
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
    pub(crate) deployment: Deployment,
    pub(crate) config: Config,
}

impl ClientBuilder {
    /// The lease of locks taken without an explicit lease. The watchdog renews them every
    /// third of it while they are held. Default 30 s.
    pub fn watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.config.watchdog_timeout = timeout;
        self
    }

    /// Names the client's connections for `CLIENT LIST`: each one says
    /// `CLIENT SETNAME <name>:<uuid>` right after it connects, where `<uuid>` is
    /// [`Client::id`](crate::Client::id), the first half of every holder field the client
    /// writes (36 characters, always the last 36 of the connection's name). A lock held by
    /// `<uuid>:<owner id>` then leads to its client's connections (`name=<name>:<uuid>`)
    /// and their addresses. Default [`DEFAULT_CLIENT_NAME`](crate::DEFAULT_CLIENT_NAME)
    /// (`rlock`).
    ///
    /// Named: the command connection, again after each reconnect (its next command names
    /// it first), the connections of synced writes, and on Sentinel the short
    /// connections that ask the sentinels and the master who the master is, and the
    /// pub/sub connection of a single server or a Sentinel master (a RESP3 connection;
    /// over RESP2, where a server refuses `HELLO`, it stays unnamed). On a cluster,
    /// redis-rs keeps a connection per node inside each cluster connection and has no
    /// hook for when it opens one:
    /// the node connections are named when the client opens a cluster connection (for
    /// commands, synced writes or pub/sub), and a pub/sub one again when its channels are
    /// subscribed again after it dropped, but one that redis-rs reopens on its own for
    /// commands or synced writes (after a reconnect, or to a node that joined) has no name.
    /// A server that refuses `CLIENT SETNAME` (an ACL user without `CLIENT`) leaves the
    /// connections unnamed; that is logged at debug level and the client works as usual.
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) fails with [`Error::InvalidConfig`](crate::Error::InvalidConfig) when `name` is
    /// empty, longer than 64 bytes, or has anything but printable ASCII other than space
    /// (Redis refuses spaces and newlines in connection names).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = name.into();
        self
    }

    /// The time allowed to open a connection (commands and pub/sub). Default 5 s.
    ///
    /// [`build`](Self::build) against a single server or a Sentinel master that accepts
    /// and never answers fails with [`Error::Unavailable`](crate::Error::Unavailable)
    /// naming its address within this plus the
    /// [`response_timeout`](Self::response_timeout) (the greeting and the connection's
    /// name).
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
    /// clients, which only hear published releases, from starving. With
    /// [`ReplicaSync::Wait`] (the default on Sentinel and Cluster) a hand-over is a
    /// grant like any other: the unlock that makes it waits for a replica, and one that
    /// no replica acknowledged is given back by the waiter, which then acquires on its
    /// own.
    pub fn handover_limit(mut self, limit: u32) -> Self {
        self.config.handover_limit = limit;
        self
    }

    /// How long a run of hand-overs on one name may last, counted from its first; the
    /// first release after that is published if anyone else may be waiting. Default
    /// [`DEFAULT_HANDOVER_WINDOW`](crate::DEFAULT_HANDOVER_WINDOW). Together with
    /// [`handover_limit`](Self::handover_limit) it bounds how long waiters of other
    /// clients wait behind this client's tasks: with locks held for milliseconds the
    /// window ends a run after a few hand-overs; with locks held for microseconds the
    /// count does.
    ///
    /// "Anyone else" is another client of this crate in the lock's line, or a second
    /// subscriber of the lock's channel (a waiting Redisson thread is subscribed): the
    /// unlock script counts them (`PUBSUB NUMSUB`), and when there is nobody the run
    /// goes on, since a published release would only wake this client's own waiters.
    /// Under [`ReplicaSync::Wait`] (where a Redisson client may subscribe at a replica,
    /// which the count does not see) and on a cluster without sharded pub/sub (where a
    /// script sees the subscribers of its own node only), every run ends with its window.
    /// A run still ends whoever waits after `handover_limit` grants or 16 windows, and
    /// the client's waiters then leave the lock alone for 1/32 of the run (at most 5 ms),
    /// so a waiter that is not subscribed (Redisson's `RSpinLock`, a `try_lock` loop)
    /// gets its chance at least that often: one that tries every 2 ms waited through at
    /// most 34-65 grants of one client's four tasks (`tests/redisson_peers.rs`).
    pub fn handover_window(mut self, window: Duration) -> Self {
        self.config.handover_window = window;
        self
    }

    /// How long a published release keeps the lock for the client whose turn it is.
    /// Default [`DEFAULT_TURN_WINDOW`](crate::DEFAULT_TURN_WINDOW); `Duration::ZERO`
    /// turns turns off.
    ///
    /// Clients of this crate that find a lock busy line up in Redis, one entry per client
    /// (`docs/protocol.md` 2.6). A release that is published (not handed to a task of the
    /// releasing client) gives the turn to the client first in line: for this long, the
    /// waiting calls of other clients leave the free lock to that client's waiter (a
    /// single [`try_lock`](crate::Lock::try_lock) takes it all the same). Without it the
    /// lock goes to whichever process answers the message first, which is the one that
    /// was already running (in tests one process of four took 98% of the grants). A
    /// client whose turn it is but that no longer waits costs the others this window
    /// once. Redisson clients, and clients of this crate with turns off, do not look at
    /// turns: they take a free lock as they always do. The turn only lasts this long, so
    /// a client that wakes slower than that (a heavily loaded machine) races as without
    /// turns. A client that hears another's turn announced holds its waiters back for its
    /// own window, not the releaser's, and takes a turn longer than its own window
    /// plus 2 ms for foreign data (its waiting calls take the free lock during it):
    /// give every client of a name the same window.
    pub fn turn_window(mut self, window: Duration) -> Self {
        self.config.turn_window = window;
        self
    }

    /// The fair lock's wait timeout: Redisson's `fairLockWaitTimeout`. Where Java
    /// services share a fair lock's name, set it to their value (Redisson's default is
    /// 300 s since 3.46.0, where the setting appeared; Redisson 3.13.3 to 3.45 fixed it
    /// at 300 s, earlier versions at 5 s). Default
    /// [`DEFAULT_FAIR_LOCK_WAIT_TIMEOUT`](crate::DEFAULT_FAIR_LOCK_WAIT_TIMEOUT) (300 s).
    ///
    /// A waiter that joins a fair lock's queue gets the deadline of the waiter before it
    /// plus this, and each grant takes this off every other waiter's deadline, as in
    /// Redisson's scripts. A waiter of this crate asks again every third of this or of
    /// 5 s, whichever is shorter, and each time moves its own deadline to at least now +
    /// this per place from the head, so it is never taken as gone while it waits. A
    /// waiter that crashed is passed over once its deadline passes: about this long after
    /// its last attempt, once it is first in line (`docs/protocol.md` 8.4). Where only
    /// clients of this crate share the name, a lower value passes crashed waiters sooner.
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) fails with [`Error::InvalidConfig`](crate::Error::InvalidConfig)
    /// below 30 ms or above 2^40 ms.
    pub fn fair_lock_wait_timeout(mut self, timeout: Duration) -> Self {
        self.config.fair_lock_wait_timeout = timeout;
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
    /// [`build`](Self::build) fails with [`Error::InvalidConfig`](crate::Error::InvalidConfig) when `pem` holds no
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
    /// [`build`](Self::build) fails with [`Error::InvalidConfig`](crate::Error::InvalidConfig) when the certificate
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
}
