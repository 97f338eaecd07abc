//! A permit of a [`PermitExpirableSemaphore`] held by a guard: given back when the
//! guard is dropped, and in watchdog mode kept alive while the guard lives.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::api::permits::{unhex, Permit, PermitExpirableSemaphore};
use crate::config::{check_lease, MAX_DURATION};
use crate::error::{Error, Result};
use crate::shell::inflight::Completing;
use crate::shell::sync_wait::Until;
use crate::shell::watchdog::{Held, WatchedPermit};
use crate::wire::sync_raw;

enum Kind {
    /// Renewed by the client's watchdog; lost when it says so.
    Watched(Arc<WatchedPermit>),
    /// A fixed lease: surely gone at `expires` (counted from when the acquire was sent).
    Lease { expires: Instant },
}

struct State {
    semaphore: PermitExpirableSemaphore,
    id: [u8; 16],
    hex: String,
    kind: Kind,
    /// Its entry among the client's held permits (see `watchdog::Held`).
    key: u64,
}

/// One permit of a [`PermitExpirableSemaphore`], given back when dropped. Made by
/// [`acquire_permit`](PermitExpirableSemaphore::acquire_permit) and its forms.
///
/// In watchdog mode (no lease given) the client's watchdog renews the permit's lease
/// in `{<name>}:timeout` every third of the watchdog timeout while the guard lives, in
/// one script call per semaphore and [`RENEW_BATCH`](crate::protocol::RENEW_BATCH)
/// permits; a Redisson peer sees only the permit's score move forward. If this process
/// dies, the permit comes back when its last lease ends. With a fixed lease the permit
/// lives until that lease ends, or until the guard goes, whichever comes first.
///
/// Give it back with [`release`](Self::release) to see errors. Dropping the guard gives
/// it back in the background, once, on the client's runtime (errors are logged with
/// `tracing`); it never panics. [`Client::shutdown`](crate::Client::shutdown) gives
/// back the permit of every guard still alive, which then reports
/// [`is_lost`](Self::is_lost) and gives nothing back again.
#[must_use = "dropping the guard gives the permit back at once"]
pub struct PermitGuard {
    state: Option<State>,
}

impl std::fmt::Debug for PermitGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("PermitGuard");
        if let Some(s) = &self.state {
            d.field("name", &s.semaphore.name).field("id", &s.hex);
        }
        d.finish()
    }
}

impl PermitGuard {
    fn state(&self) -> &State {
        // Only release() and drop() take the state, and both consume the guard.
        self.state
            .as_ref()
            .expect("permit guard state is present until release or drop")
    }

    /// The permit's id (32 hex digits, as [`Permit::id`]).
    pub fn id(&self) -> &str {
        &self.state().hex
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.state().semaphore.name
    }

    /// Whether the watchdog renews this permit (taken without a lease).
    pub fn is_watchdog(&self) -> bool {
        matches!(self.state().kind, Kind::Watched(_))
    }

    /// Whether the permit is known to be lost, as [`LockGuard::is_lost`](crate::LockGuard::is_lost):
    /// a renewal found it gone from the lease set, or the lease the client last
    /// confirmed (its fixed lease, without the watchdog) has run out by the monotonic
    /// clock, whether or not the watchdog could run meanwhile, or the client shut down.
    /// Once true, it stays true.
    pub fn is_lost(&self) -> bool {
        let state = self.state();
        let inner = &state.semaphore.inner;
        if inner.closed.is_set() {
            return true;
        }
        match &state.kind {
            Kind::Watched(e) => inner.watchdog.check_permit_lost(e),
            Kind::Lease { expires } => Instant::now() >= *expires,
        }
    }

    /// Completes when the permit is lost (see [`is_lost`](Self::is_lost)), at the
    /// latest when the confirmed lease runs out; pending while it is held. Check
    /// [`is_lost`](Self::is_lost) again right before recording work: after a pause both
    /// this and the work may be ready at once.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn lost(&self) {
        let state = self.state();
        let inner = &state.semaphore.inner;
        let lost = async {
            match &state.kind {
                Kind::Watched(e) => inner.watchdog.permit_lost(e).await,
                Kind::Lease { expires } => tokio::time::sleep_until(*expires).await,
            }
        };
        tokio::select! {
            _ = lost => {}
            _ = inner.closed.wait() => {}
        }
    }

    /// Gives the permit back and reports the outcome.
    ///
    /// # Errors
    ///
    /// - [`Error::LeaseLost`]: the guard already knew it was lost
    ///   ([`is_lost`](Self::is_lost)); whatever is left of it in Redis is given back
    ///   all the same.
    /// - [`Error::PermitNotHeld`]: Redis had no live lease of it although the guard did
    ///   not know it was lost (released by id elsewhere, or the lease set edited).
    /// - [`Error::Closed`] when shutdown gave it back already; transient errors (the release may then have
    ///   happened or not; the lease ends it anyway).
    ///
    /// # Cancel safety
    ///
    /// Once sent, the release finishes in the background if the future is dropped.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn release(mut self) -> Result<()> {
        let lost = self.is_lost();
        let Some(state) = self.state.take() else {
            return Ok(());
        };
        state.stop_renewing();
        if !state.semaphore.inner.watchdog.unhold_permits(state.key) {
            return Err(Error::Closed);
        }
        let name = state.semaphore.name.to_string();
        let request = {
            let (semaphore, id) = (state.semaphore.clone(), state.id);
            async move {
                sync_raw::permit_release(&semaphore.inner.conn, &semaphore.keys(), &[id]).await
            }
        };
        let orphan = {
            let name = name.clone();
            move |out: Result<i64>| async move {
                tracing::debug!(semaphore = %name, ?out, "permit release finished after its caller left");
            }
        };
        let live = Completing::new(state.semaphore.inner.spawner(), request, orphan).await?;
        if lost {
            Err(Error::LeaseLost { name })
        } else if live == 1 {
            Ok(())
        } else {
            Err(Error::PermitNotHeld {
                name,
                id: state.hex,
            })
        }
    }
}

impl State {
    /// Deregisters a watched permit, synchronously, before its release is sent, so that
    /// no renewal is scheduled after it.
    fn stop_renewing(&self) {
        if let Kind::Watched(e) = &self.kind {
            self.semaphore.inner.watchdog.release_permit(e);
        }
    }
}

impl Drop for PermitGuard {
    fn drop(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        state.stop_renewing();
        let inner = state.semaphore.inner.clone();
        if !inner.watchdog.unhold_permits(state.key) {
            // Shutdown gave it back.
            return;
        }
        inner.spawner().errand(async move {
            let semaphore = &state.semaphore;
            match sync_raw::permit_release(&semaphore.inner.conn, &semaphore.keys(), &[state.id]).await {
                Ok(1) => tracing::debug!(semaphore = %semaphore.name, "dropped guard gave its permit back"),
                Ok(_) => tracing::debug!(semaphore = %semaphore.name, id = %state.hex, "dropped guard: the permit was no longer held"),
                Err(e) => tracing::warn!(semaphore = %semaphore.name, error = %e, "dropped guard could not give its permit back; its lease will end"),
            }
        });
    }
}

impl PermitExpirableSemaphore {
    /// The guard of a permit just taken; nothing is awaited between the take and this,
    /// so a dropped acquire holds nothing.
    fn guard(&self, permit: Permit, watched: bool) -> Result<PermitGuard> {
        let id = unhex(permit.id())?;
        let kind = if watched {
            let sent = permit.expires_at() - permit.lease();
            let keys = (&self.name, &self.timeout, &self.channel);
            Kind::Watched(self.inner.watchdog.register_permit(keys, id, sent))
        } else {
            Kind::Lease {
                expires: permit.expires_at(),
            }
        };
        let held = Held::Expirable(
            self.name.clone(),
            self.timeout.clone(),
            self.channel.clone(),
            id,
        );
        Ok(PermitGuard {
            state: Some(State {
                key: self.inner.watchdog.hold_permits(held),
                semaphore: self.clone(),
                id,
                hex: permit.id().to_string(),
                kind,
            }),
        })
    }

    async fn guarded(&self, lease: Option<Duration>, until: Until) -> Result<Option<PermitGuard>> {
        let watched = lease.is_none();
        let lease = lease.unwrap_or_else(|| self.inner.watchdog.lease());
        check_lease(lease)?;
        match self.acquire_within(lease, until).await? {
            Some(permit) => self.guard(permit, watched).map(Some),
            None => Ok(None),
        }
    }

    /// Waits until a permit is available and takes it in watchdog mode: its lease (the
    /// client's watchdog timeout) is renewed while the returned guard lives, and the
    /// permit goes back when the guard is dropped.
    ///
    /// Use the guard forms when the code that takes a permit also gives it back.
    /// [`acquire`](Self::acquire), [`release`](Self::release) and
    /// [`update_lease_time`](Self::update_lease_time) work by id, as Redisson's methods
    /// do: for a permit handed to other code (a Java peer, another process) by its id.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves no permit taken.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn acquire_permit(&self) -> Result<PermitGuard> {
        loop {
            if let Some(g) = self.guarded(None, Until::Forever).await? {
                return Ok(g);
            }
        }
    }

    /// As [`acquire_permit`](Self::acquire_permit), with a fixed `lease` that nothing
    /// renews; the permit also goes back when the guard is dropped.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire_permit`](Self::acquire_permit).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn acquire_permit_with_lease(&self, lease: Duration) -> Result<PermitGuard> {
        loop {
            if let Some(g) = self.guarded(Some(lease), Until::Forever).await? {
                return Ok(g);
            }
        }
    }

    /// Tries for at most `wait` (zero: one try) to take a permit in watchdog mode, as
    /// [`acquire_permit`](Self::acquire_permit); `Ok(None)` when none became available
    /// in time.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire_permit`](Self::acquire_permit).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn try_acquire_permit(&self, wait: Duration) -> Result<Option<PermitGuard>> {
        self.guarded(None, Until::after(wait.min(MAX_DURATION)))
            .await
    }

    /// Tries for at most `wait` to take a permit with the fixed `lease`, as
    /// [`acquire_permit_with_lease`](Self::acquire_permit_with_lease).
    ///
    /// The lease comes first, then the wait: the other way round from Redisson's
    /// `tryAcquire(waitTime, leaseTime)` and from [`Lock::try_lock_for`](crate::Lock::try_lock_for),
    /// and both are a `Duration`, so code ported from Java compiles with them swapped.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire_permit`](Self::acquire_permit).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn try_acquire_permit_with_lease(
        &self,
        lease: Duration,
        wait: Duration,
    ) -> Result<Option<PermitGuard>> {
        self.guarded(Some(lease), Until::after(wait.min(MAX_DURATION)))
            .await
    }
}
