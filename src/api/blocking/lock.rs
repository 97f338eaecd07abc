//! The blocking lock handle and its guard: each method runs the async one to its end on
//! the calling thread, as the caller's owner (its thread, or its tokio task inside one).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{check_can_block, Runtime};
use crate::error::{Error, Result};
use crate::identity::OwnerId;

/// A named distributed lock with blocking methods, reentrant per OS thread, or per tokio
/// task inside one (see the [module docs](super), *Owners*). Made by [`Client::lock`](super::Client::lock) or
/// [`Client::fenced_lock`](super::Client::fenced_lock); cheap to clone, and may be
/// shared between threads. Every method that takes the lock returns a [`LockGuard`]
/// that releases one hold.
///
/// The methods behave as those of the async [`crate::Lock`] of the same name (waits,
/// leases, the watchdog, bounds, errors), with the calling thread (or task) as owner.
///
/// ```no_run
/// # fn demo(client: redis_rlock::blocking::Client) -> redis_rlock::Result<()> {
/// let lock = client.lock("orders:42");
/// std::thread::scope(|s| {
///     for _ in 0..2 {
///         // Two threads: one at a time inside.
///         s.spawn(|| lock.run(|| println!("inside")));
///     }
/// });
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    inner: crate::api::lock::Lock,
    runtime: Arc<Runtime>,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Lock").field(&self.inner).finish()
    }
}

impl Lock {
    pub(super) fn new(inner: crate::api::lock::Lock, runtime: Arc<Runtime>) -> Lock {
        Lock { inner, runtime }
    }

    fn guard(&self, guard: crate::api::guard::LockGuard) -> LockGuard {
        LockGuard {
            inner: Some(guard),
            runtime: self.runtime.clone(),
        }
    }

    fn maybe_guard(&self, guard: Option<crate::api::guard::LockGuard>) -> Option<LockGuard> {
        guard.map(|g| self.guard(g))
    }

    /// The lock's name, which is also its Redis key.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The lock's pub/sub channel (see [`crate::Lock::channel`]).
    pub fn channel(&self) -> &str {
        self.inner.channel()
    }

    /// Whether this is a fenced lock: every acquisition draws a fencing token.
    pub fn is_fenced(&self) -> bool {
        self.inner.is_fenced()
    }

    /// The async lock underneath (its owner is the task, not the thread).
    pub fn as_async(&self) -> &crate::api::lock::Lock {
        &self.inner
    }

    /// Waits until the lock is taken, as [`crate::Lock::lock`]: the lease is the
    /// client's watchdog timeout, renewed by the watchdog until the guard is released,
    /// also while this thread is blocked or busy. A second `lock()` by the owner that
    /// holds the lock (the thread, or the task inside tokio) re-enters at once; other
    /// owners wait. Waits without limit; use
    /// [`try_lock_for`](Self::try_lock_for) to bound the wait.
    ///
    /// # Errors
    ///
    /// As [`crate::Lock::lock`] (name errors, [`Error::WrongType`], refusals, transient
    /// errors, [`Error::Closed`] after shutdown); [`Error::BlockingNotAllowed`] on a
    /// thread that drives a current-thread tokio runtime.
    ///
    /// # Panics
    ///
    /// Only where tokio forbids blocking in a way this crate cannot see (module docs,
    /// *Threads*).
    pub fn lock(&self) -> Result<LockGuard> {
        self.runtime.run(self.inner.lock()).map(|g| self.guard(g))
    }

    /// Waits until the lock is taken with a fixed lease and no watchdog, as
    /// [`crate::Lock::lock_with_lease`].
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), and [`Error::InvalidLease`] or
    /// [`Error::DurationOutOfRange`] for the lease.
    ///
    /// # Panics
    ///
    /// As [`lock`](Self::lock).
    pub fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        self.runtime
            .run(self.inner.lock_with_lease(lease))
            .map(|g| self.guard(g))
    }

    /// One attempt, no waiting, as [`crate::Lock::try_lock`]: `Ok(None)` when another
    /// owner holds the lock. Kept by the watchdog. Returns within one response timeout.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock); [`Error::Timeout`] when Redis did not answer in time.
    ///
    /// # Panics
    ///
    /// As [`lock`](Self::lock).
    pub fn try_lock(&self) -> Result<Option<LockGuard>> {
        self.runtime
            .run(self.inner.try_lock())
            .map(|g| self.maybe_guard(g))
    }

    /// One attempt with a fixed lease, no waiting, as
    /// [`crate::Lock::try_lock_with_lease`].
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Self::try_lock), and [`Error::InvalidLease`] or
    /// [`Error::DurationOutOfRange`] for the lease.
    ///
    /// # Panics
    ///
    /// As [`lock`](Self::lock).
    pub fn try_lock_with_lease(&self, lease: Duration) -> Result<Option<LockGuard>> {
        self.runtime
            .run(self.inner.try_lock_with_lease(lease))
            .map(|g| self.maybe_guard(g))
    }

    /// Tries for at most `wait` (Redisson's `tryLock(wait, lease)`), as
    /// [`crate::Lock::try_lock_for`]: `lease: None` means a watchdog lease. Returns
    /// `Ok(None)` once `wait` has passed without the lock, by `now + wait` plus a few
    /// ms whatever Redis does.
    ///
    /// # Errors
    ///
    /// As [`lock_with_lease`](Self::lock_with_lease) (a `wait` beyond
    /// [`MAX_DURATION`](crate::MAX_DURATION) waits as [`lock`](Self::lock) does);
    /// [`Error::Timeout`] when Redis gave no answer at all before the deadline.
    ///
    /// # Panics
    ///
    /// As [`lock`](Self::lock).
    pub fn try_lock_for(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>> {
        self.runtime
            .run(self.inner.try_lock_for(wait, lease))
            .map(|g| self.maybe_guard(g))
    }

    /// Tries until `deadline`, as [`crate::Lock::try_lock_until`]; a deadline already
    /// passed makes one attempt.
    ///
    /// # Errors
    ///
    /// As [`try_lock_for`](Self::try_lock_for).
    ///
    /// # Panics
    ///
    /// As [`lock`](Self::lock).
    pub fn try_lock_until(
        &self,
        deadline: Instant,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>> {
        self.runtime
            .run(self.inner.try_lock_until(deadline, lease))
            .map(|g| self.maybe_guard(g))
    }

    /// Takes the lock ([`lock`](Self::lock)), runs `work` on this thread while holding
    /// it, releases it, and returns what `work` returned.
    ///
    /// `work` cannot be stopped half-way: if the lock is lost while it runs, the
    /// release reports [`Error::LeaseLost`] and its output is not returned. Check
    /// [`LockGuard::is_lost`] (or use a fencing token) inside long work instead.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock) for taking it, as [`LockGuard::unlock`] for the release.
    ///
    /// # Panics
    ///
    /// As [`lock`](Self::lock), and if `work` panics (the guard's drop then releases
    /// the lock).
    pub fn run<T>(&self, work: impl FnOnce() -> T) -> Result<T> {
        let guard = self.lock()?;
        let out = work();
        guard.unlock()?;
        Ok(out)
    }

    /// Deletes the lock whoever holds it and wakes its waiters (Redisson's
    /// `forceUnlock`), as [`crate::Lock::force_unlock`]. Returns whether a lock was
    /// deleted.
    ///
    /// # Errors
    ///
    /// As [`crate::Lock::force_unlock`]; [`Error::BlockingNotAllowed`] as for
    /// [`lock`](Self::lock).
    ///
    /// # Panics
    ///
    /// As [`lock`](Self::lock).
    pub fn force_unlock(&self) -> Result<bool> {
        self.runtime.run(self.inner.force_unlock())
    }

    /// Whether anyone holds the lock now. One round trip.
    ///
    /// # Errors
    ///
    /// As [`crate::Lock::is_locked`]; [`Error::BlockingNotAllowed`] as for
    /// [`lock`](Self::lock).
    ///
    /// # Panics
    ///
    /// As [`lock`](Self::lock).
    pub fn is_locked(&self) -> Result<bool> {
        self.runtime.run(self.inner.is_locked())
    }

    /// Whether the caller's owner holds the lock: its thread, or its tokio task inside
    /// one (Redisson's `isHeldByCurrentThread`).
    ///
    /// # Errors
    ///
    /// As [`hold_count`](Self::hold_count).
    ///
    /// # Panics
    ///
    /// As [`lock`](Self::lock).
    pub fn is_held_by_current_thread(&self) -> Result<bool> {
        Ok(self.hold_count()? > 0)
    }

    /// How many holds the caller's owner (thread or task) has on the lock; 0 if none (Redisson's
    /// `getHoldCount`).
    ///
    /// # Errors
    ///
    /// As [`crate::Lock::hold_count`]; [`Error::BlockingNotAllowed`] as for
    /// [`lock`](Self::lock).
    ///
    /// # Panics
    ///
    /// As [`lock`](Self::lock).
    pub fn hold_count(&self) -> Result<u32> {
        self.runtime.run(self.inner.hold_count())
    }

    /// Time until the lock expires: `None` when it is not locked, as
    /// [`crate::Lock::remaining_ttl`].
    ///
    /// # Errors
    ///
    /// As [`crate::Lock::remaining_ttl`]; [`Error::BlockingNotAllowed`] as for
    /// [`lock`](Self::lock).
    ///
    /// # Panics
    ///
    /// As [`lock`](Self::lock).
    pub fn remaining_ttl(&self) -> Result<Option<Duration>> {
        self.runtime.run(self.inner.remaining_ttl())
    }
}

/// One hold of a [`Lock`], released by [`unlock`](Self::unlock) or by dropping it.
///
/// It remembers its owner (the thread, or tokio task, that took it), so it may be sent to another
/// thread and released there. Dropping it releases the hold before `drop` returns
/// (logging what goes wrong), except on a thread where blocking is not allowed (module
/// docs, *Threads*), where the release runs in the background.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    /// `None` once released.
    inner: Option<crate::api::guard::LockGuard>,
    runtime: Arc<Runtime>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::LockGuard")
            .field(&self.inner)
            .finish()
    }
}

impl LockGuard {
    fn held(&self) -> &crate::api::guard::LockGuard {
        self.inner
            .as_ref()
            .expect("a guard is released only when consumed or dropped")
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.held().name()
    }

    /// The owner this hold was taken by: the thread's ([`OwnerId::Thread`]), or inside a
    /// tokio task the task's ([`OwnerId::Task`]; module docs, *Owners*).
    pub fn owner(&self) -> OwnerId {
        self.held().owner()
    }

    /// The fencing token of this acquisition, for a fenced lock (see
    /// [`crate::LockGuard::fencing_token`]); `None` for a plain lock.
    pub fn fencing_token(&self) -> Option<u64> {
        self.held().fencing_token()
    }

    /// Whether the watchdog renews this hold (taken without an explicit lease).
    pub fn is_watchdog(&self) -> bool {
        self.held().is_watchdog()
    }

    /// The hash field this hold is counted under: `<client uuid>:<owner id>` (Redisson's
    /// layout), as [`crate::LockGuard::holder_field`].
    pub fn holder_field(&self) -> &str {
        self.held().holder_field()
    }

    /// Blocks until the lock is lost (see [`is_lost`](Self::is_lost)) or `timeout`
    /// passes; whether it was lost. The blocking form of [`crate::LockGuard::lost`]: a
    /// thread that watches a long job can stop it when the lock is gone.
    ///
    /// # Errors
    ///
    /// [`Error::BlockingNotAllowed`] on a thread that drives a current-thread tokio
    /// runtime (use [`is_lost`](Self::is_lost) there).
    ///
    /// # Panics
    ///
    /// As [`Lock::lock`].
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool> {
        let guard = self.held();
        self.runtime.run(async move {
            Ok(
                tokio::time::timeout(timeout.min(crate::config::MAX_DURATION), guard.lost())
                    .await
                    .is_ok(),
            )
        })
    }

    /// Whether the lock is known to be lost, as [`crate::LockGuard::is_lost`]: found
    /// gone or taken over by the watchdog, or its confirmed lease ran out by the clock.
    /// No round trip; true no later than the key can expire on Redis. Check it right
    /// before a write the lock protects.
    pub fn is_lost(&self) -> bool {
        self.held().is_lost()
    }

    /// Releases this hold and reports the outcome, as [`crate::LockGuard::unlock`].
    ///
    /// # Errors
    ///
    /// As [`crate::LockGuard::unlock`] ([`Error::LeaseLost`], [`Error::NotHeld`],
    /// [`Error::PermissionDenied`], transient errors once retries are spent,
    /// [`Error::Closed`] after shutdown). [`Error::BlockingNotAllowed`] on a thread that
    /// drives a current-thread tokio runtime: the hold is then released in the
    /// background, as dropping the guard there does.
    ///
    /// # Panics
    ///
    /// As [`Lock::lock`].
    pub fn unlock(mut self) -> Result<()> {
        let guard = self.inner.take().expect("not yet released");
        check_can_block()?;
        self.runtime.run(guard.unlock())
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(guard) = self.inner.take() else {
            return;
        };
        if check_can_block().is_err() {
            // The async guard's drop releases in the background.
            drop(guard);
            return;
        }
        let name = guard.name().to_string();
        match self.runtime.run(guard.unlock()) {
            Ok(()) => tracing::debug!(lock = %name, "dropped blocking guard released the lock"),
            Err(Error::Closed) => {}
            Err(e @ Error::LeaseLost { .. }) => {
                tracing::debug!(lock = %name, error = %e, "dropped blocking guard")
            }
            Err(e) => {
                tracing::warn!(lock = %name, error = %e, "dropped blocking guard could not unlock; the lease will expire")
            }
        }
    }
}
