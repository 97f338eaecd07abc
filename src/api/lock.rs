//! The lock handle users call.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::api::guard::LockGuard;
use crate::config::MAX_DURATION;
use crate::error::{Error, Result};
use crate::identity::Kind;
use crate::shell::acquire::Wait;
use crate::shell::services::ClientInner;
use crate::shell::target::Target;
use crate::wire::raw;

/// A named distributed lock, reentrant per tokio task (see [`OwnerId`](crate::OwnerId); futures run
/// concurrently inside one task are one owner unless each runs in its own
/// [`OwnerId::scope`](crate::OwnerId::scope)).
///
/// Made by [`Client::lock`](crate::Client::lock); cheap to clone. Every method that takes the lock returns a
/// [`LockGuard`] that releases one hold.
///
/// # Cancellation
///
/// All methods are cancel safe: dropping a pending `lock()` or `try_lock_for()` future
/// never leaves a hold behind. If the acquire request was already sent, it finishes in the
/// background and the hold it took, if any, is released there. The same holds for a lock
/// handed over to a waiter that has just left (see
/// [`ClientBuilder::handover_limit`](crate::ClientBuilder::handover_limit)). The waiter's
/// pub/sub subscription is dropped with the future.
///
/// ```no_run
/// # async fn demo() -> redis_rlock::Result<()> {
/// use std::time::Duration;
/// let client = redis_rlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let lock = client.lock("orders:42");
///
/// let outer = lock.lock().await?;          // waits; the watchdog keeps the lease alive
/// let inner = lock.lock().await?;          // same task: re-enters, hold count 2
/// assert_eq!(lock.hold_count().await?, 2);
/// inner.unlock().await?;                   // hold count 1, still locked
/// outer.unlock().await?;                   // released; one waiter is woken
///
/// if let Some(g) = lock.try_lock_for(Duration::from_millis(500), Some(Duration::from_secs(10))).await? {
///     // held for at most 10 s, no watchdog
///     g.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    target: Target,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.target.name)
            .field("fenced", &self.target.fenced)
            .field("kind", &self.target.kind)
            .finish()
    }
}

impl Lock {
    pub(crate) fn new(inner: Arc<ClientInner>, name: String, fenced: bool, kind: Kind) -> Lock {
        Lock {
            target: Target::new(inner, name, fenced, kind),
        }
    }

    /// Whether this is a fenced lock ([`Client::fenced_lock`](crate::Client::fenced_lock)): every acquisition
    /// draws a fencing token.
    pub fn is_fenced(&self) -> bool {
        self.target.fenced
    }

    /// The lock's name, which is also its Redis key.
    pub fn name(&self) -> &str {
        &self.target.name
    }

    /// The lock's pub/sub channel: `redisson_lock__channel:{<name>}`, or
    /// `redisson_lock__channel:<name>` when the name carries its own hash tag
    /// (`docs/protocol.md` 1.4); `redisson_rwlock:{<name>}` for either half of a
    /// [`ReadWriteLock`](crate::ReadWriteLock).
    pub fn channel(&self) -> &str {
        &self.target.channel
    }

    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    pub(crate) fn kind(&self) -> Kind {
        self.target.kind
    }

    pub(crate) fn client_id(&self) -> &str {
        &self.target.inner.id
    }

    pub(crate) fn watchdog_timeout(&self) -> Duration {
        self.target.inner.config.watchdog_timeout
    }

    /// Waits until the lock is taken. The lease is the client's watchdog timeout, and the
    /// watchdog renews it until the guard is released (see [`LockGuard::lost`]).
    ///
    /// Waits without limit; use [`try_lock_for`](Self::try_lock_for) to bound the wait.
    ///
    /// Re-entrant per owner (see [`OwnerId`](crate::OwnerId)): a second `lock()` by the
    /// task (or thread) that holds the lock returns at once with another guard. A task
    /// spawned by the holder is another owner and waits.
    ///
    /// A nested `lock()` of a plain lock is served by the client without asking Redis
    /// while the outer hold's lease is known live: it learns of a takeover (a force
    /// unlock by another client, a deleted key) no sooner than the outer guard does, at
    /// the next renewal (within a third of the watchdog timeout). A
    /// [`fenced_lock`](crate::Client::fenced_lock) asks Redis for every re-entry, as
    /// Redisson does, and each re-entry gets its own token.
    ///
    /// **Futures joined or selected inside one task** (`join!`, `select!`,
    /// `FuturesUnordered`) are *one* owner, so both enter. Run each in its own
    /// [`OwnerId::scope`](crate::OwnerId::scope) (or its own task) when they must exclude each other:
    ///
    /// ```no_run
    /// # async fn demo(lock: redis_rlock::Lock) -> redis_rlock::Result<()> {
    /// use redis_rlock::OwnerId;
    /// let one = OwnerId::scope(async { lock.lock().await?.unlock().await });
    /// let two = OwnerId::scope(async { lock.lock().await?.unlock().await });
    /// let (a, b) = tokio::join!(one, two); // one at a time inside
    /// a?;
    /// b?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// - Input: [`Error::EmptyName`], [`Error::NameTooLong`],
    ///   [`Error::NameNotClusterSafe`], checked before anything is sent.
    /// - [`Error::WrongType`]: the key holds something other than a lock hash.
    /// - [`Error::NotALock`]: the key is a hash of other fields than a lock's, at the
    ///   first busy reply (nobody would ever release it); nothing was written.
    /// - [`Error::BadTokenCounter`]: the fencing counter cannot issue a token; no hold
    ///   was taken.
    /// - [`Error::PermissionDenied`], [`Error::AuthFailed`]: refused by Redis.
    /// - Transient ([`Error::is_transient`]): [`Error::Unavailable`],
    ///   [`Error::Timeout`], [`Error::NotReplicated`]. The first attempt reports them
    ///   at once; once waiting, they are ridden out for the client's
    ///   [`retry_window`](crate::ClientBuilder::retry_window).
    ///
    /// # Time
    ///
    /// Unbounded while the lock is held by others. A grant that arrives after the lease
    /// it granted has run out (Redis stalled longer than the lease) is given back and the
    /// wait goes on: the guard returned is never already lost.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves no hold and no place in line behind (the
    /// client's subscription to the lock's channel goes after its linger, 200 ms). An
    /// acquire already sent finishes in the background, and a hold it took is released
    /// there.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn lock(&self) -> Result<LockGuard> {
        self.target
            .acquire_unbounded(None)
            .await
            .map(LockGuard::from)
    }

    /// Waits until the lock is taken, with a fixed lease and no watchdog: the lock
    /// expires `lease` after it was taken unless released before. Re-entry adds a hold
    /// and never shortens a longer lease the holder already has. Taken inside a
    /// watchdog hold of the same owner, it is covered by that hold; once the watchdog
    /// holds are all released, the lock ends with this lease (at once, published, if it
    /// has run out meanwhile).
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), and [`Error::InvalidLease`] or
    /// [`Error::DurationOutOfRange`] for a lease under 1 ms or beyond
    /// [`MAX_DURATION`](crate::MAX_DURATION). A fraction of a millisecond is dropped,
    /// as Redis keeps leases in whole milliseconds.
    ///
    /// # Time
    ///
    /// Unbounded while the lock is held by others (see [`lock`](Self::lock)).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        self.target
            .acquire_unbounded(Some(lease))
            .await
            .map(LockGuard::from)
    }

    /// One attempt, no waiting. `Ok(None)` when someone else holds the lock. A free lock
    /// is taken even during another client's turn (the short window after a release in
    /// which [waiting calls](Self::lock) of this crate leave the lock to the next client
    /// in line; see [`docs::protocol`](crate::docs::protocol) 2.6), as Redisson's
    /// `tryLock()` takes it. The lock is kept by the watchdog.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock); transient errors are returned, never retried past the
    /// bound below. [`Error::Timeout`] when Redis did not answer within one response
    /// timeout, or answered after the lease it granted had run out.
    ///
    /// # Time
    ///
    /// Returns within one [`response_timeout`](crate::ClientBuilder::response_timeout)
    /// (plus a few ms), whatever Redis does.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock). When the bound passes first, the attempt
    /// finishes in the background the same way.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn try_lock(&self) -> Result<Option<LockGuard>> {
        self.target
            .acquire(None, Wait::No)
            .await
            .map(|g| g.map(LockGuard::from))
    }

    /// Tries for at most `wait` (Redisson's `tryLock(wait, lease)`). `lease: None` means
    /// a watchdog lease; `Some(lease)` a fixed one. Returns `Ok(None)` once `wait` has
    /// passed, measured on the monotonic clock, without the lock. A zero `wait` makes one
    /// attempt, as [`try_lock`](Self::try_lock).
    ///
    /// # Errors
    ///
    /// As [`lock_with_lease`](Self::lock_with_lease) (a `wait` beyond
    /// [`MAX_DURATION`](crate::MAX_DURATION), `Duration::MAX` say, waits as
    /// [`lock`](Self::lock) does). [`Error::Timeout`] (transient) when Redis
    /// gave no answer at all before the deadline; `Ok(None)` means it answered that
    /// someone else holds the lock, and kept doing so until the deadline.
    ///
    /// # Time
    ///
    /// Returns by `now + wait` plus a few ms (measured: a 200 ms wait returned after
    /// 202 ms while Redis was stopped), even with an attempt in flight at the deadline:
    /// that attempt finishes in the background.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn try_lock_for(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>> {
        // A wait beyond the largest duration is forever, as for `lock`.
        let wait = wait.min(MAX_DURATION);
        let until = Instant::now().checked_add(wait);
        self.target
            .acquire(
                lease,
                if wait.is_zero() {
                    Wait::No
                } else {
                    Wait::Until(until)
                },
            )
            .await
            .map(|g| g.map(LockGuard::from))
    }

    /// One attempt with a fixed lease, no waiting: `Ok(None)` when someone else holds
    /// the lock.
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Self::try_lock), and [`Error::InvalidLease`] or
    /// [`Error::DurationOutOfRange`] for the lease.
    ///
    /// # Time
    ///
    /// As [`try_lock`](Self::try_lock): within one response timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn try_lock_with_lease(&self, lease: Duration) -> Result<Option<LockGuard>> {
        self.target
            .acquire(Some(lease), Wait::No)
            .await
            .map(|g| g.map(LockGuard::from))
    }

    /// Tries until `deadline` (a `std` or tokio `Instant`), as
    /// [`try_lock_for`](Self::try_lock_for) does for a duration; a deadline already
    /// passed makes one attempt. `lease: None` means a watchdog lease.
    ///
    /// # Errors
    ///
    /// As [`try_lock_for`](Self::try_lock_for).
    ///
    /// # Time
    ///
    /// Returns by `deadline` plus a few ms (one response timeout for a deadline already
    /// passed).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn try_lock_until(
        &self,
        deadline: impl Into<Instant>,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>> {
        let deadline = deadline.into();
        let wait = if deadline <= Instant::now() {
            Wait::No
        } else {
            Wait::Until(Some(deadline))
        };
        self.target
            .acquire(lease, wait)
            .await
            .map(|g| g.map(LockGuard::from))
    }

    /// Takes the lock ([`lock`](Self::lock)), runs `work` while holding it, releases it,
    /// and returns what `work` returned. The hold cannot be dropped by mistake, as
    /// `let _ = lock.lock().await?` would (that releases at once).
    ///
    /// If the lock is lost while `work` runs ([`LockGuard::lost`]), `work` is dropped
    /// at its current await point and the call returns [`Error::LeaseLost`]: nothing
    /// after that point runs unprotected.
    ///
    /// ```no_run
    /// # async fn demo(lock: redis_rlock::Lock) -> redis_rlock::Result<()> {
    /// let total = lock.run(|| async {
    ///     // ... read, compute, write: only one holder at a time ...
    ///     42
    /// }).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock) for taking it; [`Error::LeaseLost`] when it was lost
    /// during `work`; as [`LockGuard::unlock`] for the release (the output of `work` is
    /// then not returned: it was not known to be protected to its end).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `work` where it is and releases the lock in the
    /// background, as dropping a guard does.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled, or if
    /// `work` panics (the lock is then released in the background).
    pub async fn run<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let guard = self.lock().await?;
        let out = tokio::select! {
            out = work() => out,
            _ = guard.lost() => {
                return Err(Error::LeaseLost {
                    name: self.target.name.to_string(),
                })
            }
        };
        guard.unlock().await?;
        Ok(out)
    }

    /// Deletes the lock whoever holds it, and wakes its waiters (Redisson's
    /// `forceUnlock`). Returns whether a lock was deleted. Watchdog guards of this client
    /// on this name report [`lost`](LockGuard::lost) at once; fixed-lease guards learn of
    /// it when their lease ends (an `unlock()` before that answers `NotHeld`).
    ///
    /// # Errors
    ///
    /// Name errors as for [`lock`](Self::lock); [`Error::WrongType`] when the key is not
    /// a hash, [`Error::NotALock`] when it is a hash of other fields than a lock's (either
    /// is left as it is, checked in the same script as the delete: Redisson's
    /// `forceUnlock` would delete any hash);
    /// [`Error::PermissionDenied`] when ACL forbids the publish (nothing is deleted then);
    /// [`Error::Closed`] after [`Client::shutdown`](crate::Client::shutdown); transient
    /// errors as they come.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the delete sent or not; either way no hold of
    /// this client is left counted.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.target.check_usable()?;
        let inner = self.target.inner();
        let (name, channel) = (&self.target.name, &self.target.channel);
        let deleted = if self.target.kind.is_rw() {
            // Only a lock in this half's mode is deleted (Redisson's), so holds are
            // forgotten only then.
            let deleted =
                raw::force_release_rw(&inner.conn, name, channel, self.target.kind).await?;
            if deleted {
                inner.core.forget_name(name);
            }
            deleted
        } else if self.target.kind == Kind::Fair {
            inner.core.forget_name(name);
            raw::fair_leave(
                &inner.conn,
                name,
                None,
                true,
                inner.config.fair_lock_wait_timeout,
            )
            .await?
        } else {
            inner.core.forget_name(name);
            raw::force_release(&inner.conn, name, channel).await?
        };
        tracing::debug!(lock = %self.target.name, deleted, "force unlock");
        Ok(deleted)
    }
}

impl LockGuard {
    /// The [`Lock`] this guard was taken on (as tokio's `MutexGuard::mutex`). An
    /// associated function, not a method, so that `guard.lock()` cannot be mistaken for
    /// taking the lock again.
    pub fn lock(this: &Self) -> Lock {
        Lock {
            target: this.target().clone(),
        }
    }
}
