//! Distributed reentrant locks on Redis, compatible with Redisson's `RLock`.
//!
//! A lock named `orders:42` is a Redis hash at key `orders:42`; its field is the holder,
//! `<client uuid>:<owner id>`, and its value the hold count. A Rust service using this
//! crate and a Java service using Redisson's `RLock` exclude each other on the same name.
//! The key, field, channel, message and scripts are specified in [`docs::protocol`];
//! what the lock promises, with measured figures, in [`docs::guarantees`].
//!
//! - Reentrant per tokio task: nested [`Lock::lock`] calls in one task re-enter; other
//!   tasks, in this process or any other, wait (see [`OwnerId`]).
//! - A watchdog renews locks taken without a lease until they are released, and tells
//!   the holder at once through [`LockGuard::lost`] when a lock was lost anyway.
//! - Waiters sleep on one shared pub/sub connection per client and are woken by the
//!   unlock message; each wait is also bounded by the holder's TTL. A lock released
//!   while a task of the same client waits for it is handed straight to that task, oldest
//!   first, inside the unlock script (see [`ClientBuilder::handover_limit`]).
//! - Every future is cancel safe: dropping it leaves no hold and no subscription behind.
//! - Code that is not async uses `blocking` (feature `blocking`): the same locks with
//!   blocking methods, reentrant per OS thread as in Redisson (per task inside tokio).
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_rlock::Client;
//!
//! # async fn demo() -> redis_rlock::Result<()> {
//! let client = Client::connect("redis://127.0.0.1:6379").await?;
//! let lock = client.lock("orders:42");
//!
//! let guard = lock.lock().await?;
//! // ... only one holder at a time runs this ...
//! guard.unlock().await?;
//!
//! match lock.try_lock_for(Duration::from_millis(500), Some(Duration::from_secs(10))).await? {
//!     Some(guard) => guard.unlock().await?,
//!     None => println!("busy for 500 ms; giving up"),
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

// The README's examples are compiled (not run) with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod api;
mod background;
mod config;
mod error;
mod hash;
mod identity;
#[doc(hidden)]
pub mod policy;
mod shell;
mod state;
mod stats;
mod wire;

pub use api::client::{
    Client, ClientBuilder, Deployment, ReplicaSync, ShardedPubSub, SyncFailure,
    DEFAULT_CLIENT_NAME, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FAIR_LOCK_WAIT_TIMEOUT,
    DEFAULT_RESPONSE_TIMEOUT, DEFAULT_RETRY_WINDOW, DEFAULT_TURN_WINDOW, DEFAULT_WATCHDOG_TIMEOUT,
};
pub use api::guard::LockGuard;
pub use api::latch::CountDownLatch;
pub use api::lock::Lock;
pub use api::multi::{MultiGuard, MultiLock, RedLock};
pub use api::permit_guard::PermitGuard;
pub use api::permits::{Permit, PermitExpirableSemaphore};
pub use api::rw_lock::ReadWriteLock;
pub use api::semaphore::Semaphore;
pub use api::semaphore_permit::SemaphorePermit;
pub use config::{MAX_DURATION, MAX_NAME_LEN};
pub use error::{Error, Result};
pub use identity::OwnerId;
pub use state::{DEFAULT_HANDOVER_LIMIT, DEFAULT_HANDOVER_WINDOW};
pub use stats::Stats;

/// Wire-level names of the lock layout (Redisson's), for tools that inspect or drive
/// locks by hand; `docs/protocol.md` ([`docs::protocol`]) specifies them.
pub mod protocol {
    pub use crate::shell::watchdog::BATCH as RENEW_BATCH;
    pub use crate::wire::raw::{
        channel_name, clients_key, is_holder_field, is_lock_hash, queue_key, read_turn_key,
        reader_key, rw_channel_name, timeout_key, token_key, turn_key, turn_message, writer_key,
        FORCE_UNLOCK_EVENT, READ_UNLOCK_MESSAGE, UNLOCK_MESSAGE,
    };
    pub use crate::wire::sync_raw::{
        latch_channel, permit_timeout_key, semaphore_channel, LATCH_NEW_COUNT_MESSAGE,
        LATCH_ZERO_MESSAGE,
    };

    /// The text the client sends for the script `lua/<file>` (`"acquire.lua"`, ...):
    /// the file with each of its `--#include <prelude>` lines replaced by that prelude
    /// (`lua/lock_shape.lua`, `lua/line.lua`, `lua/published.lua`, `lua/count_shape.lua`),
    /// and for `release.lua` the first line that picks `PUBLISH`; `None` for a prelude or
    /// a file that is no script of the crate. The files alone do not run (a path that
    /// calls a prelude's function fails), and their SHA1 is not the one the server
    /// caches. For tools and tests that run the scripts exactly as the client does.
    pub fn script_source(file: &str) -> Option<&'static str> {
        crate::wire::scripts::source_of(file)
    }
}

/// The crate's documents (`docs/*.md` in the repository), rendered with the API.
// `KEYS[1]` and `ARGV[6]` in the protocol read as links to rustdoc; they are not.
#[allow(rustdoc::broken_intra_doc_links)]
pub mod docs {
    #[doc = include_str!("../docs/guarantees.md")]
    pub mod guarantees {}
    #[doc = include_str!("../docs/protocol.md")]
    pub mod protocol {}
    #[doc = include_str!("../docs/design.md")]
    pub mod design {}
    #[doc = include_str!("../docs/benchmarks.md")]
    pub mod benchmarks {}
}

/// The redis-rs version this crate is built on, so that a caller can use its types
/// (a `redis::Client`, errors) without pinning a version of its own.
pub use redis;

#[cfg(feature = "blocking")]
pub use api::blocking;
