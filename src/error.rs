//! The crate's one error type.

use std::time::Duration;

/// Every way an operation of this crate can fail.
///
/// Input mistakes (`EmptyName`, `InvalidLease`, ...) are reported before anything is sent
/// to Redis, so they never change a lock's state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lock name was empty.
    #[error("lock name is empty")]
    EmptyName,

    /// A lock name was longer than [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes.
    #[error("lock name is {len} bytes long; the limit is {max} bytes")]
    NameTooLong {
        /// Length of the rejected name in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },

    /// A lease was zero, or otherwise unusable.
    #[error("invalid lease {lease:?}: {reason}")]
    InvalidLease {
        /// The rejected lease.
        lease: Duration,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A duration does not fit Redis's millisecond range
    /// (see [`MAX_DURATION`](crate::MAX_DURATION)).
    #[error("{what} of {duration:?} is beyond Redis's millisecond range (at most {max:?})")]
    DurationOutOfRange {
        /// Which argument: "lease", "watchdog timeout", "response timeout", ...
        what: &'static str,
        /// The rejected duration.
        duration: Duration,
        /// The largest accepted duration.
        max: Duration,
    },

    /// A permit or count argument of a semaphore or latch was refused, and nothing was
    /// written: 0 permits to acquire or release (Redisson treats 0 as "nothing to do";
    /// here it is almost always a bug), a latch count of 0, or permits whose sum with
    /// the semaphore's count would leave the `i64` range (refused by the server).
    #[error("invalid {what} {value}: {reason}")]
    InvalidCount {
        /// Which argument: "permits", "count".
        what: &'static str,
        /// The rejected value.
        value: i64,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A release into a semaphore that does not exist (never set, deleted, or expired).
    /// Nothing was written: Redisson's `release` would create the key with the released
    /// permits, bringing a deleted semaphore back with a wrong count. Use
    /// [`Semaphore::add_permits`](crate::Semaphore::add_permits) to create one on purpose.
    #[error("semaphore `{name}` does not exist; nothing was released")]
    NoSuchSemaphore {
        /// The semaphore's name.
        name: String,
    },

    /// A permit of a permit-expirable semaphore is not held: its id is unknown, it was
    /// released already, or its lease ended (it is then back among the available ones).
    #[error("permit `{id}` of semaphore `{name}` is not held (released, expired or unknown)")]
    PermitNotHeld {
        /// The semaphore's name.
        name: String,
        /// The permit's id, in hex.
        id: String,
    },

    /// A permit id that is not 32 hex digits (the 16 bytes of an id this crate or
    /// Redisson hands out).
    #[error("permit id `{id}` is not 32 hex digits")]
    InvalidPermitId {
        /// The rejected id.
        id: String,
    },

    /// A client setting was rejected.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),

    /// The key at the lock's name holds a value that is not a hash (or, for a
    /// semaphore or latch, a string that is not an integer count).
    #[error("key `{key}` holds a value of another type than the lock, semaphore or latch expects (WRONGTYPE)")]
    WrongType {
        /// The key.
        key: String,
    },

    /// The name holds a hash that is not a lock: application data, whose fields are not
    /// holder fields `<uuid>:<owner id>` (with a read-write lock's `mode`). Nothing was
    /// written or deleted. The lock calls return it at once rather than wait for a
    /// holder that does not exist, and `force_unlock` refuses to delete it (a difference
    /// from Redisson, whose `forceUnlock` deletes any hash).
    #[error("key `{key}` is a hash but not a lock (its fields are not lock holders'); nothing was changed")]
    NotALock {
        /// The key.
        key: String,
    },

    /// An unlock by an owner that does not hold the lock (never held it, the lease
    /// expired, or somebody force-unlocked it).
    #[error("lock `{name}` is not held by owner `{owner}`")]
    NotHeld {
        /// The lock's name.
        name: String,
        /// The holder field that tried to unlock: `<client uuid>:<owner id>`.
        owner: String,
    },

    /// This guard's hold is known lost (see `LockGuard::is_lost`): found gone or taken
    /// over, or its confirmed (or fixed) lease ran out by the clock. It no longer
    /// protects anything. Also what [`Lock::run`](crate::Lock::run) returns when the lock
    /// was lost during its work.
    #[error("lock `{name}` was lost while held (lease expired or taken over)")]
    LeaseLost {
        /// The lock's name.
        name: String,
    },

    /// No replica acknowledged an acquisition within the replica sync timeout; it was
    /// rolled back (see [`ReplicaSync`](crate::ReplicaSync)).
    #[error("lock `{name}` was taken on the master but no replica acknowledged it within {waited:?}; rolled back")]
    NotReplicated {
        /// The lock's name.
        name: String,
        /// The `WAIT` timeout.
        waited: Duration,
    },

    /// The name cannot be used on a cluster: its auxiliary keys (channel, token
    /// counter, latches) would hash to another slot than the lock itself. This happens
    /// only for names with braces that do not form a hash tag, such as `a}b` or `{}x`.
    #[error("lock name `{name}` cannot be used on a cluster: its auxiliary keys would land in another slot")]
    NameNotClusterSafe {
        /// The rejected name.
        name: String,
    },

    /// Redis refused the command for lack of ACL rights.
    #[error("permission denied by Redis ACL: {message}")]
    PermissionDenied {
        /// Redis's own message.
        message: String,
    },

    /// Redis refused this client's credentials: no password where one is required
    /// (`NOAUTH`), a wrong user or password (`WRONGPASS`), or a disabled user. Not
    /// transient: retrying with the same settings fails the same way.
    #[error("Redis refused authentication: {message}")]
    AuthFailed {
        /// Redis's (or the driver's) own message.
        message: String,
    },

    /// The fencing token counter of a lock holds something that is not a
    /// non-negative integer (or is not a string at all), so no token can be issued.
    /// No hold was taken (a negative counter was incremented by the attempt, nothing
    /// else was written). A sound counter whose `INCR` the server refuses (out of
    /// memory, an ACL) is not reported so: that is the server's own error. Fix or
    /// delete the counter; deleting
    /// it restarts tokens from 1, which a fenced resource will refuse until they pass
    /// the highest it has seen.
    #[error("fencing token counter `{key}` is corrupt (not a non-negative integer); the lock was not taken")]
    BadTokenCounter {
        /// The counter's key, `redisson_lock_token:{<name>}`.
        key: String,
    },

    /// The task (owner) that asked for the write half of a read-write lock holds its
    /// read half: Redisson's layout lets no writer in while any reader holds, the asker
    /// included, so waiting would never end. Release the read holds first, then take the
    /// write lock (the reverse, a writer taking the read lock, is allowed). Returned at
    /// once; nothing was sent.
    #[error("read-write lock `{name}`: the caller holds its read lock and asked for the write lock (upgrade refused; it would wait for itself forever)")]
    UpgradeRefused {
        /// The lock's name.
        name: String,
    },

    /// The client was shut down ([`Client::shutdown`](crate::Client::shutdown)): its
    /// waiters left with this error, and every method of its locks and guards answers
    /// with it from then on.
    #[error("the client was shut down")]
    Closed,

    /// A call of the blocking API (`redis_rlock::blocking`, feature `blocking`) was made
    /// on a thread that drives a current-thread tokio runtime, where blocking would stall
    /// (or deadlock) that runtime and tokio panics. Nothing was sent. Call it from
    /// `spawn_blocking`, a plain thread, or a multi-thread runtime.
    #[error("a blocking lock call on a thread that drives a current-thread tokio runtime; use spawn_blocking")]
    BlockingNotAllowed,

    /// Redis did not answer in time.
    #[error("Redis did not answer within {after:?} ({op})")]
    Timeout {
        /// What was being done.
        op: &'static str,
        /// The timeout that ran out.
        after: Duration,
    },

    /// Redis cannot be reached, or the connection broke.
    #[error("Redis at {addr} is unreachable: {source}")]
    Unavailable {
        /// The server the client was talking to: `host:port` of a single server or of
        /// the Sentinel master, the cluster's seed nodes, or the sentinels while none
        /// named a master.
        addr: String,
        /// The driver's error.
        #[source]
        source: redis::RedisError,
    },

    /// Any other error reported by Redis or the driver.
    #[error("Redis error: {0}")]
    Redis(#[source] redis::RedisError),
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Classifies a driver error. `key` names the lock the command touched, so that a
    /// WRONGTYPE reply can say which key is wrong; `addr` the server it went to, so that
    /// an outage says where.
    pub(crate) fn from_redis(
        err: redis::RedisError,
        key: &str,
        timeout: Duration,
        addr: &str,
    ) -> Error {
        // By the server's error code or the driver's kind, never by the message's words:
        // those differ between servers and versions. Our scripts give the failures they
        // can meet a code of their own (`NOPERM` for a refused publish, `BADTOKEN`).
        match err.code() {
            Some("WRONGTYPE") => {
                return Error::WrongType {
                    key: key.to_string(),
                }
            }
            Some("NOPERM") => {
                return Error::PermissionDenied {
                    message: err.to_string(),
                }
            }
            Some("NOAUTH" | "WRONGPASS") => {
                return Error::AuthFailed {
                    message: err.to_string(),
                }
            }
            Some("NOTALOCK") => {
                return Error::NotALock {
                    key: key.to_string(),
                }
            }
            Some("BADTOKEN") => {
                return Error::BadTokenCounter {
                    key: err.detail().unwrap_or_default().to_string(),
                }
            }
            _ => {}
        }
        if err.kind() == redis::ErrorKind::AuthenticationFailed {
            return Error::AuthFailed {
                message: err.to_string(),
            };
        }
        if err.is_timeout() {
            return Error::Timeout {
                op: "command",
                after: timeout,
            };
        }
        if err.is_io_error()
            || err.is_connection_refusal()
            || err.is_connection_dropped()
            || err.is_unrecoverable_error()
        {
            return Error::Unavailable {
                addr: addr.to_string(),
                source: err,
            };
        }
        Error::Redis(err)
    }

    /// True for errors that say nothing about the lock itself, only that Redis could not
    /// be asked (timeouts, broken connections). Such errors are worth a retry later.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. } | Error::Unavailable { .. } | Error::NotReplicated { .. }
        ) || matches!(self, Error::Redis(e) if is_failover_reply(e))
    }

    /// True when the request may have run on the server although no reply came back
    /// (a timeout, or a connection that broke after it was sent). A refused connection
    /// sent nothing.
    /// A timeout named for the call it ended (a connection's own timeout only knows it
    /// was a command); any other error as it is.
    pub(crate) fn during(self, call: &'static str) -> Error {
        match self {
            Error::Timeout {
                op: "command",
                after,
            } => Error::Timeout { op: call, after },
            other => other,
        }
    }

    pub(crate) fn may_have_run(&self) -> bool {
        match self {
            Error::Timeout { .. } => true,
            Error::Unavailable { source, .. } => !source.is_connection_refusal(),
            _ => false,
        }
    }
}

/// Replies a server gives while a failover is under way: the command did not run.
fn is_failover_reply(e: &redis::RedisError) -> bool {
    matches!(
        e.code(),
        Some("READONLY" | "MASTERDOWN" | "LOADING" | "CLUSTERDOWN" | "TRYAGAIN" | "MOVED" | "ASK")
    )
}
