//! The blocking forms of the permit guards: dropping one gives its permits back before
//! `drop` returns (in the background on a thread that may not block), as the blocking
//! [`LockGuard`](super::LockGuard) releases its lock.

use std::sync::Arc;
use std::time::Duration;

use super::sync::{PermitExpirableSemaphore, Semaphore};
use super::{check_can_block, Runtime};
use crate::error::{Error, Result};

/// Permits of a blocking [`Semaphore`], as [`crate::SemaphorePermit`]: dropping the
/// guard gives them back, also when the thread unwinds from a panic. Made by
/// [`Semaphore::acquire_permits`] and its `try_` forms.
#[must_use = "dropping the guard gives the permits back at once"]
pub struct SemaphorePermit {
    /// `None` once given back or forgotten.
    inner: Option<crate::api::semaphore_permit::SemaphorePermit>,
    runtime: Arc<Runtime>,
}

impl std::fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::SemaphorePermit")
            .field(&self.inner)
            .finish()
    }
}

impl SemaphorePermit {
    /// How many permits it holds.
    pub fn permits(&self) -> u32 {
        self.inner.as_ref().map_or(0, |p| p.permits())
    }

    /// Keeps the permits taken, as [`crate::SemaphorePermit::forget`].
    pub fn forget(mut self) -> u32 {
        self.inner.take().map_or(0, |p| p.forget())
    }

    /// Gives the permits back and reports the outcome.
    ///
    /// # Errors
    ///
    /// As [`crate::SemaphorePermit::release`]; [`Error::BlockingNotAllowed`] on a thread
    /// that drives a current-thread tokio runtime (the permits then go back in the
    /// background, as the async guard's drop gives them).
    pub fn release(mut self) -> Result<()> {
        let Some(permit) = self.inner.take() else {
            return Ok(());
        };
        check_can_block()?;
        self.runtime.run(permit.release())
    }
}

impl Drop for SemaphorePermit {
    fn drop(&mut self) {
        let Some(permit) = self.inner.take() else {
            return;
        };
        if check_can_block().is_err() {
            return;
        }
        let name = permit.name().to_string();
        match self.runtime.run(permit.release()) {
            Ok(()) | Err(Error::Closed) => {}
            Err(e) => {
                tracing::warn!(semaphore = %name, error = %e, "dropped blocking guard could not give its permits back")
            }
        }
    }
}

/// A permit of a blocking [`PermitExpirableSemaphore`], as [`crate::PermitGuard`]:
/// renewed by the watchdog while it lives (taken without a lease), given back when
/// dropped. Made by [`PermitExpirableSemaphore::acquire_permit`] and its forms.
#[must_use = "dropping the guard gives the permit back at once"]
pub struct PermitGuard {
    /// `None` once given back.
    inner: Option<crate::api::permit_guard::PermitGuard>,
    runtime: Arc<Runtime>,
}

impl std::fmt::Debug for PermitGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::PermitGuard")
            .field(&self.inner)
            .finish()
    }
}

impl PermitGuard {
    fn held(&self) -> &crate::api::permit_guard::PermitGuard {
        self.inner
            .as_ref()
            .expect("a guard is released only when consumed or dropped")
    }

    /// The permit's id (32 hex digits).
    pub fn id(&self) -> &str {
        self.held().id()
    }

    /// Whether the watchdog renews this permit (taken without a lease).
    pub fn is_watchdog(&self) -> bool {
        self.held().is_watchdog()
    }

    /// Whether the permit is known to be lost, as [`crate::PermitGuard::is_lost`]. No
    /// round trip.
    pub fn is_lost(&self) -> bool {
        self.held().is_lost()
    }

    /// Blocks until the permit is lost or `timeout` passes; whether it was lost.
    ///
    /// # Errors
    ///
    /// [`Error::BlockingNotAllowed`] on a thread that drives a current-thread tokio
    /// runtime (use [`is_lost`](Self::is_lost) there).
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

    /// Gives the permit back and reports the outcome.
    ///
    /// # Errors
    ///
    /// As [`crate::PermitGuard::release`]; [`Error::BlockingNotAllowed`] on a thread
    /// that drives a current-thread tokio runtime (the permit then goes back in the
    /// background).
    pub fn release(mut self) -> Result<()> {
        let Some(guard) = self.inner.take() else {
            return Ok(());
        };
        check_can_block()?;
        self.runtime.run(guard.release())
    }
}

impl Drop for PermitGuard {
    fn drop(&mut self) {
        let Some(guard) = self.inner.take() else {
            return;
        };
        if check_can_block().is_err() {
            return;
        }
        let name = guard.name().to_string();
        match self.runtime.run(guard.release()) {
            Ok(()) | Err(Error::Closed) | Err(Error::LeaseLost { .. }) => {}
            Err(e) => {
                tracing::debug!(semaphore = %name, error = %e, "dropped blocking permit guard")
            }
        }
    }
}

impl Semaphore {
    fn guard(&self, permit: crate::api::semaphore_permit::SemaphorePermit) -> SemaphorePermit {
        SemaphorePermit {
            inner: Some(permit),
            runtime: self.runtime.clone(),
        }
    }

    /// Takes `permits`, waiting as long as it takes, and returns a guard that gives them
    /// back when dropped, as [`crate::Semaphore::acquire_permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::acquire`].
    pub fn acquire_permits(&self, permits: u32) -> Result<SemaphorePermit> {
        let p = self.runtime.run(self.inner.acquire_permits(permits))?;
        Ok(self.guard(p))
    }

    /// Takes `permits` if they are available now, with a guard.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::try_acquire`].
    pub fn try_acquire_permits(&self, permits: u32) -> Result<Option<SemaphorePermit>> {
        let p = self.runtime.run(self.inner.try_acquire_permits(permits))?;
        Ok(p.map(|p| self.guard(p)))
    }

    /// Takes `permits`, waiting at most `wait`, with a guard; `None` if they did not
    /// come in time.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::try_acquire_for`].
    pub fn try_acquire_permits_for(
        &self,
        permits: u32,
        wait: Duration,
    ) -> Result<Option<SemaphorePermit>> {
        let p = self
            .runtime
            .run(self.inner.try_acquire_permits_for(permits, wait))?;
        Ok(p.map(|p| self.guard(p)))
    }

    /// Takes `permits`, runs `work` on this thread, and gives them back however `work`
    /// ends (a panic included), as [`crate::Semaphore::run`].
    ///
    /// # Errors
    ///
    /// As [`acquire_permits`](Self::acquire_permits); as [`SemaphorePermit::release`]
    /// for giving them back (the output of `work` is then not returned).
    ///
    /// # Panics
    ///
    /// If `work` panics (the permits are given back while the thread unwinds).
    pub fn run<T>(&self, permits: u32, work: impl FnOnce() -> T) -> Result<T> {
        let guard = self.acquire_permits(permits)?;
        let out = work();
        guard.release()?;
        Ok(out)
    }
}

impl PermitExpirableSemaphore {
    fn guard(&self, permit: crate::api::permit_guard::PermitGuard) -> PermitGuard {
        PermitGuard {
            inner: Some(permit),
            runtime: self.runtime.clone(),
        }
    }

    /// Takes a permit in watchdog mode, waiting as long as it takes, as
    /// [`crate::PermitExpirableSemaphore::acquire_permit`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitExpirableSemaphore::acquire`].
    pub fn acquire_permit(&self) -> Result<PermitGuard> {
        let g = self.runtime.run(self.inner.acquire_permit())?;
        Ok(self.guard(g))
    }

    /// Takes a permit with a fixed `lease`, with a guard, waiting as long as it takes.
    ///
    /// # Errors
    ///
    /// As [`crate::PermitExpirableSemaphore::acquire`].
    pub fn acquire_permit_with_lease(&self, lease: Duration) -> Result<PermitGuard> {
        let g = self
            .runtime
            .run(self.inner.acquire_permit_with_lease(lease))?;
        Ok(self.guard(g))
    }

    /// Takes a permit in watchdog mode, waiting at most `wait`; `None` if none came.
    ///
    /// # Errors
    ///
    /// As [`crate::PermitExpirableSemaphore::try_acquire`].
    pub fn try_acquire_permit(&self, wait: Duration) -> Result<Option<PermitGuard>> {
        let g = self.runtime.run(self.inner.try_acquire_permit(wait))?;
        Ok(g.map(|g| self.guard(g)))
    }

    /// Takes a permit with a fixed `lease`, waiting at most `wait`; `None` if none came.
    ///
    /// The lease comes first, then the wait: the other way round from Redisson's
    /// `tryAcquire(waitTime, leaseTime)` and from [`Lock::try_lock_for`](crate::Lock::try_lock_for),
    /// and both are a `Duration`, so code ported from Java compiles with them swapped.
    ///
    /// # Errors
    ///
    /// As [`crate::PermitExpirableSemaphore::try_acquire`].
    pub fn try_acquire_permit_with_lease(
        &self,
        lease: Duration,
        wait: Duration,
    ) -> Result<Option<PermitGuard>> {
        let g = self
            .runtime
            .run(self.inner.try_acquire_permit_with_lease(lease, wait))?;
        Ok(g.map(|g| self.guard(g)))
    }
}
