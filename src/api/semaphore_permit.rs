//! Permits of a [`Semaphore`] held by a guard that gives them back when dropped.

use std::future::Future;
use std::time::Duration;

use crate::api::semaphore::Semaphore;
use crate::config::MAX_DURATION;
use crate::error::{Error, Result};
use crate::shell::inflight::Completing;
use crate::shell::sync_wait::Until;
use crate::shell::watchdog::Held;
use crate::wire::sync_raw::{self, Give};

/// Permits taken from a [`Semaphore`] by [`acquire_permits`](Semaphore::acquire_permits)
/// and its `try_` forms; they go back when it is dropped.
///
/// Give them back with [`release`](Self::release) to see errors. Dropping the guard
/// gives them back in the background, once, on the client's runtime (errors are logged
/// with `tracing`); it never panics. That covers a task that panics, returns early with
/// `?`, or is cancelled while it holds them.
/// [`Client::shutdown`](crate::Client::shutdown) gives back the permits of every guard
/// still alive; such a guard then gives nothing back again.
///
/// Redis knows no owner of a semaphore's permits (Redisson's layout): the guard only
/// remembers how many it holds. [`forget`](Self::forget) keeps them taken for code that
/// releases by count ([`Semaphore::release`]).
#[must_use = "dropping the guard gives the permits back at once"]
pub struct SemaphorePermit {
    semaphore: Option<Semaphore>,
    permits: u32,
    /// Its entry among the client's held permits (see `watchdog::Held`).
    key: u64,
}

impl std::fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("SemaphorePermit");
        if let Some(s) = &self.semaphore {
            d.field("name", &s.name);
        }
        d.field("permits", &self.permits).finish()
    }
}

impl SemaphorePermit {
    /// How many permits it holds.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.semaphore.as_ref().map_or("", |s| s.name())
    }

    /// Keeps the permits taken and returns their number: nothing goes back on drop.
    /// Someone must give them back by count ([`Semaphore::release`]), or they stay
    /// taken for good, as with Redisson.
    pub fn forget(mut self) -> u32 {
        if let Some(s) = self.semaphore.take() {
            s.inner.watchdog.unhold_permits(self.key);
        }
        self.permits
    }

    /// Gives the permits back and reports the outcome, as [`Semaphore::release`].
    ///
    /// # Errors
    ///
    /// As [`Semaphore::release`]: [`Error::NoSuchSemaphore`] when the key was deleted
    /// meanwhile (nothing written), [`Error::Closed`] when shutdown gave the permits back
    /// already, transient errors (the release may then have happened or not; it is not
    /// sent again).
    ///
    /// # Cancel safety
    ///
    /// Once sent, the release finishes in the background if the future is dropped;
    /// dropped before its first poll, the guard's drop gives the permits back.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn release(mut self) -> Result<()> {
        let permits = self.permits;
        let Some(s) = self.semaphore.take() else {
            return Ok(());
        };
        if !s.inner.watchdog.unhold_permits(self.key) {
            return Err(Error::Closed);
        }
        let inner = s.inner.clone();
        let name = s.name.clone();
        let request = async move {
            sync_raw::semaphore_release(
                &s.inner.conn,
                &s.name,
                &s.channel,
                i64::from(permits),
                Give::Release,
            )
            .await
        };
        let orphan = {
            let name = name.clone();
            move |out: Result<Option<i64>>| async move {
                tracing::debug!(semaphore = %name, ?out, "release finished after its caller left");
            }
        };
        match Completing::new(inner.spawner(), request, orphan).await? {
            Some(_) => Ok(()),
            None => Err(Error::NoSuchSemaphore {
                name: name.to_string(),
            }),
        }
    }
}

impl Drop for SemaphorePermit {
    fn drop(&mut self) {
        let Some(semaphore) = self.semaphore.take() else {
            return;
        };
        let inner = semaphore.inner.clone();
        if !inner.watchdog.unhold_permits(self.key) {
            // Shutdown gave them back.
            return;
        }
        let permits = self.permits;
        inner.spawner().errand(async move {
            let back = sync_raw::semaphore_release(
                &semaphore.inner.conn,
                &semaphore.name,
                &semaphore.channel,
                i64::from(permits),
                Give::Release,
            )
            .await;
            match back {
                Ok(Some(_)) => {
                    tracing::debug!(semaphore = %semaphore.name, permits, "dropped guard gave its permits back")
                }
                Ok(None) => {
                    tracing::warn!(semaphore = %semaphore.name, permits, "dropped guard: the semaphore no longer exists")
                }
                Err(e) => {
                    tracing::warn!(semaphore = %semaphore.name, permits, error = %e, "dropped guard could not give its permits back")
                }
            }
        });
    }
}

impl Semaphore {
    fn guard(&self, permits: u32) -> SemaphorePermit {
        let held = Held::Count(self.name.clone(), self.channel.clone(), permits);
        SemaphorePermit {
            key: self.inner.watchdog.hold_permits(held),
            semaphore: Some(self.clone()),
            permits,
        }
    }

    /// Waits until `permits` permits are available, takes them, and returns a guard that
    /// gives them back when dropped: `let _permit = sem.acquire_permits(1).await?;`.
    ///
    /// Use this (or [`run`](Self::run)) when the code that takes the permits also gives
    /// them back. [`acquire`](Self::acquire) and [`release`](Self::release) count
    /// permits only, as Redisson's `acquire` and `release` do: for permits taken in one
    /// place and given back in another (a Java peer, another process). Both share the
    /// same count.
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
    pub async fn acquire_permits(&self, permits: u32) -> Result<SemaphorePermit> {
        loop {
            // Nothing is awaited between the take and the guard: a dropped call holds
            // no permit.
            if self.acquire_within(permits, Until::Forever).await? {
                return Ok(self.guard(permits));
            }
        }
    }

    /// One try, no waiting, as [`try_acquire`](Self::try_acquire), with a guard as
    /// [`acquire_permits`](Self::acquire_permits).
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire_permits`](Self::acquire_permits).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn try_acquire_permits(&self, permits: u32) -> Result<Option<SemaphorePermit>> {
        let got = self.acquire_within(permits, Until::Once).await?;
        Ok(got.then(|| self.guard(permits)))
    }

    /// Tries for at most `wait`, as [`try_acquire_for`](Self::try_acquire_for), with a
    /// guard as [`acquire_permits`](Self::acquire_permits).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_for`](Self::try_acquire_for).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire_permits`](Self::acquire_permits).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn try_acquire_permits_for(
        &self,
        permits: u32,
        wait: Duration,
    ) -> Result<Option<SemaphorePermit>> {
        let got = self
            .acquire_within(permits, Until::after(wait.min(MAX_DURATION)))
            .await?;
        Ok(got.then(|| self.guard(permits)))
    }

    /// Takes `permits` permits, runs `work`, and gives them back, as
    /// [`Lock::run`](crate::Lock::run) does with a lock: the permits go back however
    /// `work` ends (returns, panics, or is dropped).
    ///
    /// ```no_run
    /// # async fn demo(slots: redis_rlock::Semaphore) -> redis_rlock::Result<()> {
    /// let rows = slots.run(1, || async {
    ///     // ... at most as many of these at once as the semaphore has permits ...
    ///     42
    /// }).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire_permits`](Self::acquire_permits) for taking them; as
    /// [`SemaphorePermit::release`] for giving them back (the output of `work` is then
    /// not returned).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `work` where it is and gives the permits back in the
    /// background.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled, or if
    /// `work` panics (the permits then go back in the background).
    pub async fn run<F, Fut, T>(&self, permits: u32, work: F) -> Result<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire_permits(permits).await?;
        let out = work().await;
        guard.release().await?;
        Ok(out)
    }
}
