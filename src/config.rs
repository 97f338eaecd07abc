//! The client's settings and the limits every input is checked against. Imports nothing
//! of this crate but its error type: every other module may build on it.

use std::time::Duration;

use crate::error::{Error, Result};

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
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Deployment {
    /// One server (`redis://[user:password@]host:port[/db]`, or `rediss://` for TLS with
    /// the `tls-rustls` feature).
    Single {
        /// The server's URL.
        url: String,
    },
    /// A master found through Redis Sentinel, followed across failovers (feature
    /// `sentinel`).
    #[cfg(feature = "sentinel")]
    Sentinel {
        /// URLs of the sentinels (`redis://host:port`); asked in order. The master and
        /// its replicas are reached with the first sentinel's scheme: `rediss://`
        /// sentinels mean TLS to the master too (as Redisson does).
        sentinels: Vec<String>,
        /// The name the sentinels monitor the master under.
        master_name: String,
    },
    /// A Redis Cluster, reached through any of these seed nodes (feature `cluster`).
    #[cfg(feature = "cluster")]
    Cluster {
        /// URLs of one or more cluster nodes.
        nodes: Vec<String>,
    },
}

// URLs may carry a password; a Debug print ends up in logs.
impl std::fmt::Debug for Deployment {
    #[cfg_attr(
        not(any(feature = "cluster", feature = "sentinel")),
        allow(unused_variables)
    )]
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let masked =
            |urls: &[String]| -> Vec<String> { urls.iter().map(|u| without_password(u)).collect() };
        match self {
            Deployment::Single { url } => f
                .debug_struct("Single")
                .field("url", &without_password(url))
                .finish(),
            #[cfg(feature = "sentinel")]
            Deployment::Sentinel {
                sentinels,
                master_name,
            } => f
                .debug_struct("Sentinel")
                .field("sentinels", &masked(sentinels))
                .field("master_name", master_name)
                .finish(),
            #[cfg(feature = "cluster")]
            Deployment::Cluster { nodes } => f
                .debug_struct("Cluster")
                .field("nodes", &masked(nodes))
                .finish(),
        }
    }
}

/// Whether writes wait for replicas (Redisson's `checkLockSyncedSlaves`).
///
/// With `Wait`, every acquire and renewal (and every write of the semaphores and the
/// latch) is followed, in the same pipeline on the same connection, by
/// `WAIT acks timeout`. An acquisition that no replica acknowledged is rolled back, so
/// that a failover cannot hand the lock to a second holder; then it is retried or fails
/// with [`Error::NotReplicated`](crate::Error::NotReplicated), as [`SyncFailure`] says.
/// A lock's unlock is sent without `WAIT` (Redisson waits there too): its answer would
/// change nothing, as an unlock lost at failover leaves a lock that ends with its
/// lease, and waiting for it would only make every unlock slower. The exception is an
/// unlock that may hand the lock to another task of the client
/// ([`ClientBuilder::handover_limit`](crate::ClientBuilder::handover_limit)): that is
/// a grant, synced and undone like an acquisition. A master with no replica at all
/// (asked with `ROLE` before `WAIT` is skipped) has nothing to sync with: no `WAIT` is
/// sent and its grants stand. On by default for Sentinel and Cluster, off for a single
/// server.
///
/// `WAIT` blocks the connection it runs on, and the watchdog's renewals share it: keep
/// its timeout well below a third of the watchdog timeout (the renewal period), or
/// replicas that do not answer can hold renewals up until leases run out. The client
/// logs a warning when it is not.
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
    /// Fail at once with [`Error::NotReplicated`](crate::Error::NotReplicated).
    Fail,
    /// Try again, up to `attempts` more times, then fail with [`Error::NotReplicated`](crate::Error::NotReplicated).
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

/// Settings of a [`Client`](crate::Client), fixed when it is built.
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
    /// How long a published release saves the lock for the client first in line
    /// (`ZERO`: turns off).
    pub(crate) turn_window: Duration,
    /// Redisson's `fairLockWaitTimeout`: the fair lock's deadlines are chained and
    /// shortened by this much, as Redisson's are (`docs/protocol.md` 8).
    pub(crate) fair_lock_wait_timeout: Duration,
    /// Addresses announced by sentinels, mapped to where this client reaches them.
    pub(crate) address_map: Vec<((String, u16), (String, u16))>,
    pub(crate) tls: TlsSettings,
    /// A redis-rs client the caller already had (`Client::from_redis_client`): used for
    /// a single server's connections instead of opening the URL.
    pub(crate) redis_client: Option<redis::Client>,
    /// The first part of every connection's name (`ClientBuilder::name`).
    pub(crate) name: String,
    /// The client's uuid, the first half of its holder fields and the end of its
    /// connections' names. Empty in a builder: `build` draws it, so that two clients
    /// built from clones of one builder never share it.
    pub(crate) id: String,
}

impl Config {
    /// What every connection of the client is named with `CLIENT SETNAME`:
    /// `<name>:<uuid>` (`docs/protocol.md` 1.6).
    pub(crate) fn connection_name(&self) -> String {
        format!("{}:{}", self.name, self.id)
    }
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

/// Default for [`ClientBuilder::turn_window`](crate::ClientBuilder::turn_window): how
/// long a published release keeps the lock for the client whose turn it is.
pub const DEFAULT_TURN_WINDOW: Duration = Duration::from_millis(10);

/// Default for [`ClientBuilder::fair_lock_wait_timeout`](crate::ClientBuilder::fair_lock_wait_timeout):
/// Redisson's default `fairLockWaitTimeout` (since 3.13.3), 300 s.
pub const DEFAULT_FAIR_LOCK_WAIT_TIMEOUT: Duration = Duration::from_secs(300);

/// The fair lock's wait timeout is kept between these: each waiter asks again every
/// third of it, and deadlines of `now + place * timeout` must stay exact in Redis's
/// double scores (2^40 ms is about 35 years; 2^53 ms is where doubles stop counting).
pub(crate) const FAIR_WAIT_RANGE: (Duration, Duration) =
    (Duration::from_millis(30), Duration::from_millis(1 << 40));

/// Default time a waiting task keeps retrying through errors such as a failover.
pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(10);

/// Default for [`ClientBuilder::name`](crate::ClientBuilder::name): the first part of
/// the name of every connection a client opens.
pub const DEFAULT_CLIENT_NAME: &str = "rlock";

/// Longest [`ClientBuilder::name`](crate::ClientBuilder::name) accepted, in bytes.
const MAX_CLIENT_NAME_LEN: usize = 64;

/// Checks a [`ClientBuilder::name`](crate::ClientBuilder::name): Redis refuses a
/// connection name with a space or a control character (`CLIENT SETNAME`), and a failed
/// `SETNAME` is only logged, so a bad name would silently leave connections unnamed.
pub(crate) fn check_client_name(name: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::InvalidConfig(format!("client name {name:?} {why}")));
    if name.is_empty() {
        return bad("is empty");
    }
    if name.len() > MAX_CLIENT_NAME_LEN {
        return bad(&format!("is longer than {MAX_CLIENT_NAME_LEN} bytes"));
    }
    if let Some(c) = name.chars().find(|c| !c.is_ascii_graphic()) {
        return bad(&format!(
            "has {c:?}: only printable ASCII other than space is allowed (Redis refuses spaces and newlines in connection names)"
        ));
    }
    Ok(())
}

/// Longest lock name accepted, in bytes. Redis would take more, but a name this long is
/// almost surely a bug, and every waiter and renewal would carry it.
pub const MAX_NAME_LEN: usize = 64 * 1024;

/// Longest lease or client timeout accepted: 2^62 ms (about 146 million years). Redis
/// rejects expiry times that overflow its signed 64-bit millisecond clock; this limit
/// keeps well inside it. A longer wait (`Duration::MAX`, say) is accepted, and means
/// waiting without a deadline.
pub const MAX_DURATION: Duration = Duration::from_millis(1 << 62);

pub(crate) fn check_duration(what: &'static str, d: Duration) -> Result<()> {
    if d > MAX_DURATION {
        return Err(Error::DurationOutOfRange {
            what,
            duration: d,
            max: MAX_DURATION,
        });
    }
    Ok(())
}

/// `d` without its fraction of a millisecond. Redis keeps a lease in whole milliseconds,
/// so a guard that counted the fraction too would think itself held up to 1 ms after
/// its key expired.
pub(crate) fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(crate) fn check_lease(lease: Duration) -> Result<()> {
    if lease.is_zero() {
        return Err(Error::InvalidLease {
            lease,
            reason: "a zero lease would expire before anyone could use the lock",
        });
    }
    if lease < Duration::from_millis(1) {
        return Err(Error::InvalidLease {
            lease,
            reason: "Redis counts leases in whole milliseconds; the least is 1 ms",
        });
    }
    check_duration("lease", lease)
}

/// `url` with the password of its user info (`scheme://user:password@host`) masked, for
/// error messages that end up in logs.
pub(crate) fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_names_are_printable_ascii_without_spaces() {
        for ok in ["rlock", "orders-api", "svc:eu-1/pod_7", &"n".repeat(64)] {
            assert!(check_client_name(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "",
            "with space",
            "tab\there",
            "line\n",
            "é",
            &"n".repeat(65),
        ] {
            assert!(
                matches!(check_client_name(bad), Err(Error::InvalidConfig(_))),
                "{bad:?}"
            );
        }
    }
}
