//! One hold a call got, apart from the public guard that wraps it (`api/guard.rs`):
//! what it knows of the hold, how it learns of a loss, and how it gives the hold back.
//! Its `Drop` is the one place a hold that nobody unlocked is released, so a hold is
//! never orphaned between the shell that takes it and the guard a caller keeps.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::identity::OwnerId;
use crate::shell::inflight::Completing;
use crate::shell::release::release_hold;
use crate::shell::services::ClientInner;
use crate::shell::target::{Hold, Target};
use crate::state::{Handback, InFlightGuard, WatchEntry};
use crate::stats::Event;
use crate::wire::raw::Release;

pub(crate) enum HeldKind {
    /// Renewed by the watchdog; lost when the watchdog says so.
    Watchdog(Arc<WatchEntry>),
    /// Fixed lease; surely gone at `expires` (measured from when the acquire was sent),
    /// unless a watchdog hold of the same field covers it (see `Core::cover`).
    Lease { expires: Instant },
}

struct HeldState {
    /// The lock it was taken on (which keeps its client alive).
    target: Target,
    hold: Hold,
    owner: OwnerId,
    /// `None` for a plain lock.
    token: Option<u64>,
    kind: HeldKind,
    /// When the guard was made, for the hold time.
    since: Instant,
}

/// A hold of one lock by one owner, released on drop.
pub(crate) struct Held {
    state: Option<HeldState>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("LockGuard");
        if let Some(s) = &self.state {
            d.field("name", &s.hold.name).field("holder", &s.hold.field);
        }
        d.finish()
    }
}

impl Held {
    pub(crate) fn new(
        target: Target,
        hold: Hold,
        owner: OwnerId,
        token: Option<u64>,
        kind: HeldKind,
    ) -> Held {
        Held {
            state: Some(HeldState {
                target,
                hold,
                owner,
                token,
                kind,
                since: Instant::now(),
            }),
        }
    }

    fn state(&self) -> &HeldState {
        // Only unlock() and drop() take the state, and both consume the guard.
        self.state
            .as_ref()
            .expect("guard state is present until unlock or drop")
    }
    pub(crate) fn target(&self) -> &Target {
        &self.state().target
    }
    pub(crate) fn name(&self) -> &str {
        &self.state().hold.name
    }
    pub(crate) fn owner(&self) -> OwnerId {
        self.state().owner
    }
    pub(crate) fn holder_field(&self) -> &str {
        &self.state().hold.field
    }
    pub(crate) fn fencing_token(&self) -> Option<u64> {
        self.state().token
    }
    pub(crate) fn is_watchdog(&self) -> bool {
        matches!(self.state().kind, HeldKind::Watchdog(_))
    }
    pub(crate) fn is_lost(&self) -> bool {
        let state = self.state();
        if state.target.inner.closed.is_set() {
            // The client's shutdown released it.
            return true;
        }
        match &state.kind {
            HeldKind::Watchdog(e) => state.target.inner.watchdog.check_lost(e),
            HeldKind::Lease { expires } => {
                Instant::now() >= *expires
                    && state
                        .target
                        .inner
                        .core
                        .cover(&state.hold.name, &state.hold.field, *expires)
                        .is_none()
            }
        }
    }
    pub(crate) async fn lost(&self) {
        let state = self.state();
        let lost = async {
            match &state.kind {
                HeldKind::Watchdog(e) => state.target.inner.watchdog.lost(e).await,
                HeldKind::Lease { expires } => {
                    tokio::time::sleep_until(*expires).await;
                    // Past its own lease, the hold lives as long as a watchdog hold of the
                    // same field that covered it (see `Core::cover`).
                    let core = &state.target.inner.core;
                    while let Some(e) = core.cover(&state.hold.name, &state.hold.field, *expires) {
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
    pub(crate) async fn unlock(mut self) -> Result<()> {
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

impl HeldState {
    /// Deregisters this hold, synchronously, before anything is sent, so that no renewal
    /// is scheduled after the unlock.
    fn begin_release(&self) -> Handback {
        let inner = &self.target.inner;
        inner.stats.count(Event::Released(self.since.elapsed()));
        match &self.kind {
            HeldKind::Watchdog(entry) => {
                let lost = inner.watchdog.check_lost(entry);
                inner.core.release_watched(entry, lost)
            }
            HeldKind::Lease { expires } => {
                inner
                    .core
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

impl Drop for Held {
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
        let in_flight = inner.core.begin(&state.hold.name, &state.hold.field);
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
