//! The guard a holder keeps: what it knows of its hold, how it learns of a loss, and how
//! it gives the hold back (unlock or drop).

use std::sync::Arc;

use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::identity::OwnerId;
use crate::inflight::Completing;
use crate::raw::Release;
use crate::release::release_hold;
use crate::services::ClientInner;
use crate::stats::Event;
use crate::table::{Handback, InFlightGuard, WatchEntry};
use crate::target::{Hold, Target};

pub(crate) enum GuardKind {
    /// Renewed by the watchdog; lost when the watchdog says so.
    Watchdog(Arc<WatchEntry>),
    /// Fixed lease; surely gone at `expires` (measured from when the acquire was sent),
    /// unless a watchdog hold of the same field covers it (see `Table::cover`).
    Lease { expires: Instant },
}

struct GuardState {
    /// The lock it was taken on (which keeps its client alive).
    target: Target,
    hold: Hold,
    owner: OwnerId,
    /// `None` for a plain lock.
    token: Option<u64>,
    kind: GuardKind,
    /// When the guard was made, for the hold time.
    since: Instant,
}

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
    state: Option<GuardState>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("LockGuard");
        if let Some(s) = &self.state {
            d.field("name", &s.hold.name).field("holder", &s.hold.field);
        }
        d.finish()
    }
}

impl LockGuard {
    pub(crate) fn new(
        target: Target,
        hold: Hold,
        owner: OwnerId,
        token: Option<u64>,
        kind: GuardKind,
    ) -> LockGuard {
        LockGuard {
            state: Some(GuardState {
                target,
                hold,
                owner,
                token,
                kind,
                since: Instant::now(),
            }),
        }
    }

    fn state(&self) -> &GuardState {
        // Only unlock() and drop() take the state, and both consume the guard.
        self.state
            .as_ref()
            .expect("guard state is present until unlock or drop")
    }

    /// The lock this guard holds.
    pub(crate) fn target(&self) -> &Target {
        &self.state().target
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.state().hold.name
    }

    /// The owner id the lock was taken with.
    pub fn owner(&self) -> OwnerId {
        self.state().owner
    }

    /// The holder field written in the lock hash: `<client uuid>:<owner id>`.
    pub fn holder_field(&self) -> &str {
        &self.state().hold.field
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
        self.state().token
    }

    /// Whether the watchdog renews this hold (taken without an explicit lease).
    pub fn is_watchdog(&self) -> bool {
        matches!(self.state().kind, GuardKind::Watchdog(_))
    }

    /// Whether the lock is known to be lost: the watchdog found it gone or taken over,
    /// or the lease the client last confirmed has run out (for a fixed lease: the lease,
    /// unless a watchdog hold of the same owner, taken before that lease ran out, still
    /// keeps the key alive). That lease is counted on the monotonic clock from the send
    /// of the request that confirmed it, so this turns true no later than the key can expire on Redis,
    /// whether or not the watchdog could run meanwhile (a blocked thread, a paused
    /// process, a stalled Redis). Once true, it stays true.
    ///
    /// Check it right before a write the lock protects; what a pause *after* the check
    /// can do only a fencing token stops (see [`fencing_token`](Self::fencing_token)).
    pub fn is_lost(&self) -> bool {
        let state = self.state();
        if state.target.inner.closed.is_set() {
            // The client's shutdown released it.
            return true;
        }
        match &state.kind {
            GuardKind::Watchdog(e) => state.target.inner.watchdog.check_lost(e),
            GuardKind::Lease { expires } => {
                Instant::now() >= *expires
                    && state
                        .target
                        .inner
                        .table
                        .cover(&state.hold.name, &state.hold.field, *expires)
                        .is_none()
            }
        }
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
        let state = self.state();
        let lost = async {
            match &state.kind {
                GuardKind::Watchdog(e) => state.target.inner.watchdog.lost(e).await,
                GuardKind::Lease { expires } => {
                    tokio::time::sleep_until(*expires).await;
                    // Past its own lease, the hold lives as long as a watchdog hold of the
                    // same field that covered it (see `Table::cover`).
                    let table = &state.target.inner.table;
                    while let Some(e) = table.cover(&state.hold.name, &state.hold.field, *expires) {
                        tokio::select! {
                            _ = e.lost.wait() => {}
                            _ = tokio::time::sleep_until(e.valid_until()) => {}
                        }
                    }
                }
            }
        };
        tokio::select! {
            _ = lost => {}
            _ = state.target.inner.closed.wait() => {}
        }
    }

    /// Releases this hold and reports the outcome.
    ///
    /// # Errors
    ///
    /// - [`Error::LeaseLost`]: the guard already knew it was lost
    ///   ([`is_lost`](Self::is_lost): found gone by the watchdog, its confirmed or fixed
    ///   lease ran out by the clock, or a force unlock of this client for a watchdog
    ///   guard). Whatever Redis
    ///   may still keep of this hold (a renewal that landed after the client gave up on
    ///   the lease) is released all the same, unless another hold or request of the same
    ///   owner uses the field.
    /// - [`Error::NotHeld`]: Redis had no hold of this owner although the guard did not
    ///   know it was lost (force-unlocked by another client, or the key deleted).
    /// - [`Error::PermissionDenied`]: ACL forbids the unlock's publish; the lock is left
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
    pub async fn unlock(mut self) -> Result<()> {
        let Some(state) = self.state.take() else {
            return Ok(());
        };
        // Shutting down released every hold of the client already.
        state.target.inner.check_open()?;
        let span =
            tracing::debug_span!("release", lock = %state.hold.name, owner = %state.hold.field);
        async move {
            let (holds, keep) = match state.begin_release() {
                Handback::Lost { sweep } => {
                    if let Some(in_flight) = sweep {
                        let inner = state.target.inner.clone();
                        let outcome = sweep_lost(inner, state.hold.clone(), in_flight).await;
                        tracing::debug!(?outcome, "swept the field of a lost hold");
                    }
                    return Err(Error::LeaseLost {
                        name: state.hold.name.to_string(),
                    });
                }
                Handback::Local => {
                    tracing::debug!("released a local re-entry");
                    return Ok(());
                }
                Handback::Send { holds, keep } => (holds, keep),
            };
            let inner = state.target.inner.clone();
            let request = {
                let (inner, hold) = (inner.clone(), state.hold.clone());
                async move { release_hold(&inner, &hold, keep, holds).await }
            };
            let orphan = |outcome: Result<Release>| async move {
                tracing::debug!(?outcome, "unlock finished after its caller left");
            };
            match Completing::new(inner.spawner(), request, orphan).await? {
                Release::NotHeld => Err(Error::NotHeld {
                    name: state.hold.name.to_string(),
                    owner: state.hold.field.to_string(),
                }),
                r => {
                    tracing::debug!(released = (r == Release::Released), "unlocked");
                    Ok(())
                }
            }
        }
        .instrument(span)
        .await
    }
}

impl GuardState {
    /// Deregisters this hold, synchronously, before anything is sent, so that no renewal
    /// is scheduled after the unlock.
    fn begin_release(&self) -> Handback {
        let inner = &self.target.inner;
        inner.stats.count(Event::Released(self.since.elapsed()));
        match &self.kind {
            GuardKind::Watchdog(entry) => {
                let lost = inner.watchdog.check_lost(entry);
                inner.table.release_watched(entry, lost)
            }
            GuardKind::Lease { expires } => {
                inner
                    .table
                    .release_fixed(&self.hold.name, &self.hold.field, *expires)
            }
        }
    }
}

/// Deletes whatever is left under the field of a lost hold (see [`Handback::Lost`]).
async fn sweep_lost(
    inner: Arc<ClientInner>,
    hold: Hold,
    in_flight: InFlightGuard,
) -> Result<Release> {
    let spawner = inner.spawner();
    let request = async move {
        let _in_flight = in_flight;
        release_hold(&inner, &hold, None, u32::MAX).await
    };
    // Runs to its end even if the caller leaves.
    Completing::new(spawner, request, |_| async {}).await
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        if state.target.inner.closed.is_set() {
            return;
        }
        let (holds, keep) = match state.begin_release() {
            Handback::Send { holds, keep } => (holds, keep),
            Handback::Lost {
                sweep: Some(in_flight),
            } => {
                let inner = state.target.inner.clone();
                inner.clone().spawner().errand(async move {
                    let outcome = sweep_lost(inner, state.hold, in_flight).await;
                    tracing::debug!(?outcome, "swept the field of a lost hold");
                });
                return;
            }
            Handback::Local | Handback::Lost { sweep: None } => return,
        };
        let inner = state.target.inner.clone();
        // In flight from the drop itself, not from the errand's first poll: an acquire
        // of the same owner right after the drop waits for this release (see `InFlightGuard`)
        // instead of re-entering the hold it is about to give back.
        let in_flight = inner.table.begin(&state.hold.name, &state.hold.field);
        inner.clone().spawner().errand(async move {
            let _in_flight = in_flight;
            let r = release_hold(&inner, &state.hold, keep, holds).await;
            match r {
                Ok(Release::NotHeld) => {
                    tracing::warn!(lock = %state.hold.name, owner = %state.hold.field, "dropped guard: lock was no longer held")
                }
                Ok(_) => tracing::debug!(lock = %state.hold.name, "dropped guard released the lock"),
                Err(e) => tracing::warn!(lock = %state.hold.name, error = %e, "dropped guard could not unlock; the lease will expire"),
            }
        });
    }
}
