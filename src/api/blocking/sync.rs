//! The blocking forms of the read-write lock, the semaphores and the count-down latch:
//! each call runs the async one to its end on the client's runtime (module docs of
//! [`blocking`](crate::api::blocking)). Permits and counts have no owner, so the calling
//! thread matters only to the read-write lock's halves, which are [`Lock`]s.

use std::sync::Arc;
use std::time::Duration;

use super::{Lock, Runtime};
use crate::api::permits::Permit;
use crate::error::Result;

/// A read-write lock (Redisson's `RReadWriteLock`), as [`crate::ReadWriteLock`]: its
/// halves are blocking [`Lock`]s owned by the calling thread (or tokio task). Made by
/// [`Client::read_write_lock`](super::Client::read_write_lock).
#[derive(Clone)]
pub struct ReadWriteLock {
    inner: crate::api::rw_lock::ReadWriteLock,
    runtime: Arc<Runtime>,
}

impl std::fmt::Debug for ReadWriteLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::ReadWriteLock")
            .field(&self.inner)
            .finish()
    }
}

impl ReadWriteLock {
    pub(super) fn new(
        inner: crate::api::rw_lock::ReadWriteLock,
        runtime: Arc<Runtime>,
    ) -> ReadWriteLock {
        ReadWriteLock { inner, runtime }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The read half: many threads (of any process) hold it together.
    pub fn read(&self) -> Lock {
        Lock::new(self.inner.read(), self.runtime.clone())
    }

    /// The write half: one thread holds it, alone. A thread that holds the read half
    /// is refused it ([`Error::UpgradeRefused`](crate::Error::UpgradeRefused)).
    pub fn write(&self) -> Lock {
        Lock::new(self.inner.write(), self.runtime.clone())
    }
}

/// A semaphore (Redisson's `RSemaphore`), as [`crate::Semaphore`], with blocking
/// methods. Made by [`Client::semaphore`](super::Client::semaphore).
///
/// Every method may return [`Error::BlockingNotAllowed`](crate::Error::BlockingNotAllowed)
/// on a thread that drives a current-thread tokio runtime (nothing is sent), and panics
/// only where tokio forbids blocking in a way this crate cannot see (module docs,
/// *Threads*). A call cannot be cancelled: it returns by the bound it was given.
#[derive(Clone)]
pub struct Semaphore {
    pub(super) inner: crate::api::semaphore::Semaphore,
    pub(super) runtime: Arc<Runtime>,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Semaphore")
            .field(&self.inner)
            .finish()
    }
}

impl Semaphore {
    pub(super) fn new(inner: crate::api::semaphore::Semaphore, runtime: Arc<Runtime>) -> Semaphore {
        Semaphore { inner, runtime }
    }

    /// The semaphore's name (its key).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Sets the number of permits if the semaphore does not exist yet; whether it was
    /// set, as [`crate::Semaphore::try_set_permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::try_set_permits`].
    pub fn try_set_permits(&self, permits: u32) -> Result<bool> {
        self.runtime.run(self.inner.try_set_permits(permits))
    }

    /// Takes `permits`, waiting as long as it takes.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::acquire`] (0 permits is an error).
    pub fn acquire(&self, permits: u32) -> Result<()> {
        self.runtime.run(self.inner.acquire(permits))
    }

    /// Takes `permits` if they are available now.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::try_acquire`].
    pub fn try_acquire(&self, permits: u32) -> Result<bool> {
        self.runtime.run(self.inner.try_acquire(permits))
    }

    /// Takes `permits`, waiting at most `wait`: `false` if they did not come in time.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::try_acquire_for`].
    pub fn try_acquire_for(&self, permits: u32, wait: Duration) -> Result<bool> {
        self.runtime.run(self.inner.try_acquire_for(permits, wait))
    }

    /// Gives `permits` back and wakes waiters.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::release`] (a semaphore that does not exist is an error).
    pub fn release(&self, permits: u32) -> Result<()> {
        self.runtime.run(self.inner.release(permits))
    }

    /// The number of available permits.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::available_permits`].
    pub fn available_permits(&self) -> Result<i64> {
        self.runtime.run(self.inner.available_permits())
    }

    /// Takes every available permit and returns how many there were.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::drain_permits`].
    pub fn drain_permits(&self) -> Result<i64> {
        self.runtime.run(self.inner.drain_permits())
    }

    /// Adds `permits` (negative: removes them), creating the semaphore if needed.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::add_permits`].
    pub fn add_permits(&self, permits: i64) -> Result<()> {
        self.runtime.run(self.inner.add_permits(permits))
    }

    /// Deletes the semaphore, as [`crate::Semaphore::delete`] says.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::delete`].
    pub fn delete(&self) -> Result<bool> {
        self.runtime.run(self.inner.delete())
    }
}

/// A semaphore whose permits carry an id and a lease (Redisson's
/// `RPermitExpirableSemaphore`), as [`crate::PermitExpirableSemaphore`], with blocking
/// methods. Made by
/// [`Client::permit_expirable_semaphore`](super::Client::permit_expirable_semaphore).
/// Errors, panics and cancellation as for [`Semaphore`].
#[derive(Clone)]
pub struct PermitExpirableSemaphore {
    pub(super) inner: crate::api::permits::PermitExpirableSemaphore,
    pub(super) runtime: Arc<Runtime>,
}

impl std::fmt::Debug for PermitExpirableSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::PermitExpirableSemaphore")
            .field(&self.inner)
            .finish()
    }
}

impl PermitExpirableSemaphore {
    pub(super) fn new(
        inner: crate::api::permits::PermitExpirableSemaphore,
        runtime: Arc<Runtime>,
    ) -> PermitExpirableSemaphore {
        PermitExpirableSemaphore { inner, runtime }
    }

    /// The semaphore's name (its key).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Sets the number of permits if the semaphore does not exist yet.
    ///
    /// # Errors
    ///
    /// As [`crate::PermitExpirableSemaphore::try_set_permits`].
    pub fn try_set_permits(&self, permits: u32) -> Result<bool> {
        self.runtime.run(self.inner.try_set_permits(permits))
    }

    /// Takes one permit for `lease`, waiting as long as it takes. The permit comes back
    /// by itself when the lease ends, if it was not released before.
    ///
    /// # Errors
    ///
    /// As [`crate::PermitExpirableSemaphore::acquire`].
    pub fn acquire(&self, lease: Duration) -> Result<Permit> {
        self.runtime.run(self.inner.acquire(lease))
    }

    /// Takes one permit for `lease`, waiting at most `wait`: `None` if none came.
    ///
    /// The lease comes first, then the wait: the other way round from Redisson's
    /// `tryAcquire(waitTime, leaseTime)` and from [`Lock::try_lock_for`](crate::Lock::try_lock_for),
    /// and both are a `Duration`, so code ported from Java compiles with them swapped.
    ///
    /// # Errors
    ///
    /// As [`crate::PermitExpirableSemaphore::try_acquire`].
    pub fn try_acquire(&self, lease: Duration, wait: Duration) -> Result<Option<Permit>> {
        self.runtime.run(self.inner.try_acquire(lease, wait))
    }

    /// Gives the permit `id` back; whether it was held.
    ///
    /// # Errors
    ///
    /// As [`crate::PermitExpirableSemaphore::try_release`].
    pub fn try_release(&self, id: &str) -> Result<bool> {
        self.runtime.run(self.inner.try_release(id))
    }

    /// Gives the permit `id` back, and fails when it was not held.
    ///
    /// # Errors
    ///
    /// As [`crate::PermitExpirableSemaphore::release`].
    pub fn release(&self, id: &str) -> Result<()> {
        self.runtime.run(self.inner.release(id))
    }

    /// Gives the held permit `id` a new lease from now; whether it was held.
    ///
    /// # Errors
    ///
    /// As [`crate::PermitExpirableSemaphore::update_lease_time`].
    pub fn update_lease_time(&self, id: &str, lease: Duration) -> Result<bool> {
        self.runtime.run(self.inner.update_lease_time(id, lease))
    }

    /// The number of available permits (ended leases given back first).
    ///
    /// # Errors
    ///
    /// As [`crate::PermitExpirableSemaphore::available_permits`].
    pub fn available_permits(&self) -> Result<i64> {
        self.runtime.run(self.inner.available_permits())
    }

    /// Deletes the semaphore and its leases, as [`crate::PermitExpirableSemaphore::delete`]
    /// says.
    ///
    /// # Errors
    ///
    /// As [`crate::PermitExpirableSemaphore::delete`].
    pub fn delete(&self) -> Result<bool> {
        self.runtime.run(self.inner.delete())
    }
}

/// A count-down latch (Redisson's `RCountDownLatch`), as [`crate::CountDownLatch`],
/// with blocking methods. Made by [`Client::count_down_latch`](super::Client::count_down_latch).
/// Errors, panics and cancellation as for [`Semaphore`].
#[derive(Clone)]
pub struct CountDownLatch {
    inner: crate::api::latch::CountDownLatch,
    runtime: Arc<Runtime>,
}

impl std::fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::CountDownLatch")
            .field(&self.inner)
            .finish()
    }
}

impl CountDownLatch {
    pub(super) fn new(
        inner: crate::api::latch::CountDownLatch,
        runtime: Arc<Runtime>,
    ) -> CountDownLatch {
        CountDownLatch { inner, runtime }
    }

    /// The latch's name (its key).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Sets the count if the latch does not exist yet; whether it was set.
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::try_set_count`].
    pub fn try_set_count(&self, count: u32) -> Result<bool> {
        self.runtime.run(self.inner.try_set_count(count))
    }

    /// Counts down by one and returns the count left; at 0 every waiter wakes.
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::count_down`].
    pub fn count_down(&self) -> Result<i64> {
        self.runtime.run(self.inner.count_down())
    }

    /// The current count (0 when the latch does not exist).
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::count`].
    pub fn count(&self) -> Result<i64> {
        self.runtime.run(self.inner.count())
    }

    /// Blocks until the count is 0, without limit.
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::wait`].
    pub fn wait(&self) -> Result<()> {
        self.runtime.run(self.inner.wait())
    }

    /// Blocks until the count is 0, at most `timeout`: whether it reached 0.
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::wait_for`].
    pub fn wait_for(&self, timeout: Duration) -> Result<bool> {
        self.runtime.run(self.inner.wait_for(timeout))
    }

    /// Deletes the latch, as [`crate::CountDownLatch::delete`] says.
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::delete`].
    pub fn delete(&self) -> Result<bool> {
        self.runtime.run(self.inner.delete())
    }
}
