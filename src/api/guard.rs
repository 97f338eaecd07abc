//! The guard a holder keeps: the public face of a hold (`shell/held.rs` carries it out),
//! in the way `lock_api` keeps a guard apart from the raw lock it wraps.

use crate::error::Result;
use crate::identity::OwnerId;
use crate::shell::held::Held;
use crate::shell::target::Target;

/// One hold of a [`Lock`](crate::Lock).
///
/// Release it with [`unlock`](Self::unlock) to see errors. Dropping it releases the hold
/// in the background (errors are logged with `tracing`), and never panics; without a
/// running tokio runtime the hold simply expires with its lease.
///
/// The guard remembers the owner id it was taken with, so it releases the right hold
/// even when moved to another task.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    held: Held,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.held.fmt(f)
    }
}

impl From<Held> for LockGuard {
    fn from(held: Held) -> LockGuard {
        LockGuard { held }
    }
}

impl LockGuard {
    /// The lock this guard holds.
    pub(crate) fn target(&self) -> &Target {
        self.held.target()
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.held.name()
    }

    /// The owner id the lock was taken with.
    pub fn owner(&self) -> OwnerId {
        self.held.owner()
    }

    /// The holder field written in the lock hash: `<client uuid>:<owner id>`.
    pub fn holder_field(&self) -> &str {
        self.held.holder_field()
    }

    /// The fencing token of this acquisition, for a lock from
    /// [`Client::fenced_lock`](crate::Client::fenced_lock): drawn from the name's counter
    /// for this acquisition (by its grant, a re-entry's too, by the unlock that handed
    /// it the lock, or, for a hold of its field that nobody took and the call adopted,
    /// by the adopting call), so larger than every token drawn before it for this lock
    /// name, by any client (Redisson's `RFencedLock` included). A call whose reply was
    /// lost and that was sent again gets the token its first send drew, if Redis still
    /// has its record of it, else a new one. Pass it to the protected
    /// resource, which should refuse any token lower than the highest it has seen (see
    /// [`docs::guarantees`](crate::docs::guarantees)). `None` for a plain lock ([`Client::lock`](crate::Client::lock)), which, like
    /// Redisson's `RLock`, keeps no counter.
    ///
    /// A token of 1 means the counter started afresh: the first grant ever for this
    /// name, or the first after the counter was lost (a Redis restart without
    /// persistence, a failover to a replica that never had it). A resource that has seen
    /// higher tokens then refuses every holder until tokens pass its highest again;
    /// treat a 1 as the start of a new epoch (see
    /// [`docs::guarantees`](crate::docs::guarantees)).
    pub fn fencing_token(&self) -> Option<u64> {
        self.held.fencing_token()
    }

    /// Whether the watchdog renews this hold (taken without an explicit lease).
    pub fn is_watchdog(&self) -> bool {
        self.held.is_watchdog()
    }

    /// Whether the lock is known to be lost: the watchdog found it gone or taken over,
    /// or the lease the client last confirmed has run out (for a fixed lease: the lease,
    /// unless a watchdog hold of the same owner, taken before that lease ran out, still
    /// keeps the key alive). That lease is counted on the monotonic clock from the send
    /// of the request that confirmed it, so this turns true no later than the key can expire on Redis,
    /// whether or not the watchdog could run meanwhile (a blocked thread, a paused
    /// process, a stalled Redis). A watchdog guard is also lost at once when the runtime
    /// its client's watchdog runs on shuts down, as nothing renews it after that (the
    /// key keeps the rest of its lease). Once true, it stays true.
    ///
    /// Check it right before a write the lock protects; what a pause *after* the check
    /// can do only a fencing token stops (see [`fencing_token`](Self::fencing_token)).
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Completes when the lock is lost (see [`is_lost`](Self::is_lost)), at the latest
    /// when the confirmed lease runs out; pending while it is held. Race it against the
    /// critical section to stop work that is no longer protected. When both are ready
    /// at once (after a pause of the process, say) `select!` may take either branch,
    /// so the job's branch checks [`is_lost`](Self::is_lost) before it records its
    /// work:
    ///
    /// ```no_run
    /// # async fn demo(lock: redis_rlock::Lock) -> redis_rlock::Result<()> {
    /// # async fn long_job() -> u32 { 0 }
    /// # async fn record(_: u32) {}
    /// let guard = lock.lock().await?;
    /// tokio::select! {
    ///     result = long_job() => {
    ///         if guard.is_lost() {
    ///             eprintln!("lock lost; result not recorded");
    ///         } else {
    ///             record(result).await;
    ///             guard.unlock().await?;
    ///         }
    ///     }
    ///     _ = guard.lost() => eprintln!("lock lost; job abandoned"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// `is_lost` narrows the window, not closes it: for writes that must never land
    /// late, use a [`fenced_lock`](crate::Client::fenced_lock) and its token.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits, so it can be raced in `select!` and polled again.
    pub async fn lost(&self) {
        self.held.lost().await
    }

    /// Releases this hold and reports the outcome.
    ///
    /// # Errors
    ///
    /// - [`Error::LeaseLost`](crate::Error::LeaseLost): the guard already knew it was lost
    ///   ([`is_lost`](Self::is_lost): found gone by the watchdog, its confirmed or fixed
    ///   lease ran out by the clock, or a force unlock of this client for a watchdog
    ///   guard). Whatever Redis
    ///   may still keep of this hold (a renewal that landed after the client gave up on
    ///   the lease) is released all the same, unless another hold or request of the same
    ///   owner uses the field.
    /// - [`Error::NotHeld`](crate::Error::NotHeld): Redis had no hold of this owner although the guard did not
    ///   know it was lost (force-unlocked by another client, or the key deleted).
    /// - [`Error::PermissionDenied`](crate::Error::PermissionDenied): ACL forbids the unlock's publish; the lock is left
    ///   as it was, and expires with its lease.
    /// - Transient errors once the retries are spent; the hold then expires with its
    ///   lease.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if this future is dropped after the unlock was sent, it completes in
    /// the background.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn unlock(self) -> Result<()> {
        self.held.unlock().await
    }
}
