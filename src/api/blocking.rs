//! The same locks with blocking methods, for code that is not async: CLIs, build tools,
//! sync web frameworks, tests (feature `blocking`).
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_rlock::blocking::Client;
//!
//! fn main() -> redis_rlock::Result<()> {
//!     let client = Client::connect("redis://127.0.0.1:6379")?;
//!     let lock = client.lock("orders:42");
//!
//!     let outer = lock.lock()?;        // waits; the watchdog keeps the lease alive
//!     let inner = lock.lock()?;        // same thread: re-enters, hold count 2
//!     inner.unlock()?;
//!     outer.unlock()?;                 // released; one waiter is woken
//!
//!     if let Some(guard) = lock.try_lock_for(Duration::from_millis(500), None)? {
//!         // ... critical section ...
//!         drop(guard);                 // dropping releases too (and waits for it)
//!     }
//!     client.shutdown()
//! }
//! ```
//!
//! # Owners
//!
//! **Outside tokio the owner is the calling OS thread**, as in Redisson: nested `lock()`
//! calls on one thread re-enter and other threads wait. This holds on plain threads,
//! rayon's, and in a `#[tokio::main]` body (the future given to `block_on` is not a
//! task). Threads of a pool that are not tokio's (rayon) are reused: work that runs on
//! the same thread later is the same owner.
//!
//! **Inside a tokio task the owner is the task**, as for an async call there
//! ([`OwnerId::current`], which also honours [`OwnerId::scope`]): a task on a runtime's
//! worker thread, and a `spawn_blocking` closure (tokio runs each as a task of its own).
//! A worker runs other tasks while one keeps a guard across an `.await`, and the
//! blocking pool runs later closures on a thread while a guard an earlier one returned
//! is still held; with the thread as owner those would re-enter holds they do not own.
//! So nested calls within one task or closure re-enter; two tasks, or two closures,
//! wait for each other, whatever threads they share.
//!
//! A guard remembers its owner ([`LockGuard::owner`]), so it may be moved to another
//! thread and unlocked there. Locks of a blocking client and async locks on the same
//! names exclude each other, as any two owners do, when their owners differ: in one task
//! (or on one thread outside tokio, such as a `#[tokio::main]` body) a blocking lock and
//! an async lock re-enter each other.
//!
//! # Runtime
//!
//! The lock's protocol runs on tokio. [`Client::connect`] and [`ClientBuilder::build`]
//! start a small runtime of the client's own (a multi-thread runtime with 2 workers), so
//! that the watchdog renews held locks and wake-ups arrive while the calling thread is
//! blocked or busy. [`ClientBuilder::build_on`] and [`Client::from_async`] use a runtime the
//! caller already has instead; it must keep running while the client is used (a
//! multi-thread runtime, or a current-thread runtime that another thread drives with
//! `Runtime::block_on`). Each call blocks the calling thread until it is done; the
//! futures run there, with their timers and I/O on that runtime.
//!
//! # Threads
//!
//! Calls may be made from any thread: plain threads, `spawn_blocking` closures, and the
//! worker threads of a multi-thread tokio runtime (each call then runs in
//! [`tokio::task::block_in_place`], which hands that worker's other tasks to another
//! thread first). On a thread that drives a current-thread runtime (its `block_on` and
//! the tasks it runs, `#[tokio::test]` by default), blocking would stall that whole
//! runtime and tokio forbids it: every call returns [`Error::BlockingNotAllowed`] there,
//! sending nothing. Use `spawn_blocking` there. Dropping a guard there releases it in the
//! background, as an async guard's drop does.
//!
//! Two places where tokio forbids blocking cannot be told apart from allowed ones, and
//! a call there panics (tokio's panic): inside a `LocalSet` driven by a multi-thread
//! runtime's `block_on`, and on a thread that calls a current-thread runtime's
//! `block_on` while another thread drives that runtime.

use std::future::Future;
use std::sync::Arc;

use tokio::runtime::{Handle, RuntimeFlavor};

use crate::error::{Error, Result};
use crate::identity::OwnerId;

mod builder;
mod lock;
mod permits;
mod sync;

pub use crate::api::permits::Permit;
pub use builder::ClientBuilder;
pub use lock::{Lock, LockGuard};
pub use permits::{PermitGuard, SemaphorePermit};
pub use sync::{CountDownLatch, PermitExpirableSemaphore, ReadWriteLock, Semaphore};

/// Worker threads of the runtime a blocking client starts for itself: one would do for
/// the watchdog and the pub/sub connection; a second keeps renewals on time while the
/// other runs a long script reply or a reconnect.
const WORKERS: usize = 2;

/// Where a blocking client's futures run: a runtime of its own, or one it was given.
pub(crate) struct Runtime {
    handle: Handle,
    /// `Some` for a runtime of the client's own, shut down when the last client handle,
    /// lock and guard are gone.
    owned: Option<tokio::runtime::Runtime>,
}

impl Runtime {
    fn start() -> Result<Runtime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name("redis-rlock")
            .enable_all()
            .build()
            .map_err(|e| {
                Error::InvalidConfig(format!("cannot start the blocking client's runtime: {e}"))
            })?;
        Ok(Runtime {
            handle: runtime.handle().clone(),
            owned: Some(runtime),
        })
    }

    /// Runs `fut` to its end on the calling thread, as the caller's owner (module docs,
    /// *Owners*).
    pub(crate) fn run<T>(&self, fut: impl Future<Output = Result<T>>) -> Result<T> {
        check_can_block()?;
        // Not the thread inside a task: a worker thread runs other tasks while this one
        // keeps a guard across an `.await`, and `spawn_blocking` reuses its threads for
        // later closures while a guard one of them returned is still held.
        let owner = OwnerId::current();
        tokio::task::block_in_place(|| self.handle.block_on(owner.run(fut)))
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Dropping a runtime blocks until its tasks stop, which panics on an async
        // thread; the last handle may well go there. Its tasks (the watchdog, the
        // pub/sub connection) have nothing left to finish once no handle can use them.
        if let Some(runtime) = self.owned.take() {
            runtime.shutdown_background();
        }
    }
}

/// `Err(BlockingNotAllowed)` on a thread that drives a current-thread runtime (see the
/// module docs, *Threads*). A multi-thread runtime's worker may block through
/// `block_in_place`; threads that drive no runtime may always block.
pub(crate) fn check_can_block() -> Result<()> {
    if tokio::runtime::worker_index().is_none() {
        return Ok(());
    }
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => Ok(()),
        _ => Err(Error::BlockingNotAllowed),
    }
}

/// A blocking client of one Redis deployment: the same client as [`crate::Client`],
/// whose locks block the calling thread. Cheap to clone; clones share the connection,
/// the watchdog and the runtime. See the [module docs](self) for owners and threads.
#[derive(Clone)]
pub struct Client {
    inner: crate::api::client::Client,
    runtime: Arc<Runtime>,
}

impl Client {
    /// Connects with default settings, on a runtime of the client's own. See
    /// [`ClientBuilder::build`] for what is checked.
    ///
    /// # Errors
    ///
    /// As [`ClientBuilder::build`]; [`Error::BlockingNotAllowed`] on a thread that
    /// drives a current-thread tokio runtime; [`Error::InvalidConfig`] if the runtime
    /// cannot be started.
    ///
    /// # Panics
    ///
    /// Only where tokio forbids blocking in a way this client cannot see (module docs,
    /// *Threads*).
    pub fn connect(url: impl AsRef<str>) -> Result<Client> {
        Client::builder(url).build()
    }

    /// Starts a builder for a client of the Redis server at `url`, with the settings of
    /// the async [`crate::ClientBuilder`]; its [`build`](ClientBuilder::build) blocks.
    /// Sentinel, Cluster and the like start from [`crate::Client::sentinel`],
    /// [`crate::Client::cluster`], ... and go through [`ClientBuilder::from`].
    ///
    /// ```no_run
    /// # fn demo() -> redis_rlock::Result<()> {
    /// use std::time::Duration;
    /// let client = redis_rlock::blocking::Client::builder("redis://127.0.0.1:6379")
    ///     .watchdog_timeout(Duration::from_secs(10))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(url: impl AsRef<str>) -> ClientBuilder {
        ClientBuilder::from(crate::api::client::Client::builder(url))
    }

    /// A blocking client over an async client the caller already has, running its
    /// calls on `runtime`, which must keep running while this client is used (see the
    /// module docs, *Runtime*). The two share everything: holds, watchdog, connection.
    pub fn from_async(client: crate::api::client::Client, runtime: Handle) -> Client {
        Client {
            inner: client,
            runtime: Arc::new(Runtime {
                handle: runtime,
                owned: None,
            }),
        }
    }

    /// The async client underneath, for code that has both kinds of callers.
    pub fn as_async(&self) -> &crate::api::client::Client {
        &self.inner
    }

    /// A handle to the lock named `name`, as [`crate::Client::lock`] (Redisson's
    /// `RLock` layout). Nothing is sent until it is used.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.inner.lock(name), self.runtime.clone())
    }

    /// A handle to the fenced lock named `name`, as [`crate::Client::fenced_lock`]
    /// (Redisson's `RFencedLock`): every guard carries a fencing token.
    pub fn fenced_lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.inner.fenced_lock(name), self.runtime.clone())
    }

    /// A handle to the fair lock named `name`, as [`crate::Client::fair_lock`]
    /// (Redisson's `RFairLock`): threads take it in the order they came.
    pub fn fair_lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.inner.fair_lock(name), self.runtime.clone())
    }

    /// The read half of the read-write lock named `name`, as
    /// [`crate::ReadWriteLock::read`] (Redisson's `RReadWriteLock.readLock()`).
    pub fn read_lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(
            self.inner.read_write_lock(name).read(),
            self.runtime.clone(),
        )
    }

    /// The write half of the read-write lock named `name`, as
    /// [`crate::ReadWriteLock::write`] (Redisson's `RReadWriteLock.writeLock()`).
    pub fn write_lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(
            self.inner.read_write_lock(name).write(),
            self.runtime.clone(),
        )
    }

    /// The read-write lock named `name`, as [`crate::Client::read_write_lock`]: its
    /// `read()` and `write()` halves are blocking locks owned by the calling thread.
    pub fn read_write_lock(&self, name: impl Into<String>) -> ReadWriteLock {
        ReadWriteLock::new(self.inner.read_write_lock(name), self.runtime.clone())
    }

    /// The semaphore named `name`, as [`crate::Client::semaphore`] (Redisson's
    /// `RSemaphore`).
    pub fn semaphore(&self, name: impl Into<String>) -> Semaphore {
        Semaphore::new(self.inner.semaphore(name), self.runtime.clone())
    }

    /// The permit-expirable semaphore named `name`, as
    /// [`crate::Client::permit_expirable_semaphore`] (Redisson's
    /// `RPermitExpirableSemaphore`).
    pub fn permit_expirable_semaphore(&self, name: impl Into<String>) -> PermitExpirableSemaphore {
        PermitExpirableSemaphore::new(
            self.inner.permit_expirable_semaphore(name),
            self.runtime.clone(),
        )
    }

    /// The count-down latch named `name`, as [`crate::Client::count_down_latch`]
    /// (Redisson's `RCountDownLatch`).
    pub fn count_down_latch(&self, name: impl Into<String>) -> CountDownLatch {
        CountDownLatch::new(self.inner.count_down_latch(name), self.runtime.clone())
    }

    /// This client's UUID, the first half of every holder field it writes.
    pub fn id(&self) -> &str {
        self.inner.id()
    }

    /// What this client has done since it was built, as [`crate::Client::stats`]
    /// (shared with the async client underneath). Nothing is sent and nothing blocks.
    pub fn stats(&self) -> crate::Stats {
        self.inner.stats()
    }

    /// Shuts the client down, as [`crate::Client::shutdown`]: every hold the client
    /// still has is released in Redis, waiting calls on other threads return
    /// [`Error::Closed`], and the client's tasks stop. Its own runtime stops when the
    /// last handle, lock and guard of the client are dropped.
    ///
    /// # Errors
    ///
    /// As [`crate::Client::shutdown`]; [`Error::BlockingNotAllowed`] on a thread that
    /// drives a current-thread tokio runtime (nothing was done).
    ///
    /// # Panics
    ///
    /// Only where tokio forbids blocking in a way this client cannot see (module docs,
    /// *Threads*).
    pub fn shutdown(&self) -> Result<()> {
        self.runtime.run(self.inner.shutdown())
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("blocking::Client")
            .field("client", &self.inner)
            .field("own_runtime", &self.runtime.owned.is_some())
            .finish()
    }
}
