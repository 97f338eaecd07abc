//! [`MultiLock`]'s methods: every part, one after another in a fixed order.

use std::time::Duration;

use tokio::time::Instant;

use super::{check_parts, release_all, MultiGuard, MultiLock};
use crate::api::guard::LockGuard;
use crate::api::lock::Lock;
use crate::error::{Error, Result};
use crate::identity::Kind;

impl MultiLock {
    /// A lock that holds every one of `locks`. A part given twice (same name, client,
    /// kind, and fenced or not) is taken once; a fenced and a plain lock of one name are
    /// two parts (the guard keeps the fenced one's token); the read and write halves of one read-write lock are two
    /// parts, taken write first (see [`MultiLock`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `locks` is empty, or when one name of one client
    /// is both a half of a read-write lock and a plain or fair lock (the layouts differ).
    pub fn new(mut locks: Vec<Lock>) -> Result<MultiLock> {
        check_parts(&locks)?;
        locks.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
        // Parts of one name and client are one owner's holds on one hash: only an exact
        // repeat (same kind too) is redundant. The read and write halves are two holds.
        locks.dedup_by(|a, b| order_key(a) == order_key(b));
        for pair in locks.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if a.name() == b.name()
                && a.client_id() == b.client_id()
                && a.kind().is_rw() != b.kind().is_rw()
            {
                return Err(Error::InvalidConfig(format!(
                    "a multi-lock cannot hold {:?} both as a read-write lock and as a plain or \
                     fair lock: the layouts differ",
                    a.name()
                )));
            }
        }
        Ok(MultiLock { locks })
    }

    /// Waits until every part is held; the watchdogs renew them.
    ///
    /// # Errors
    ///
    /// The first part's error; the parts already taken are released.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: parts already taken are released when the future is dropped.
    pub async fn lock(&self) -> Result<MultiGuard> {
        self.lock_inner(None).await
    }

    /// Waits until every part is held, each with a fixed `lease`.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), and lease errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<MultiGuard> {
        self.lock_inner(Some(lease)).await
    }

    /// One attempt on each part in turn: `Ok(None)` (and every part taken released)
    /// as soon as one is busy.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(&self) -> Result<Option<MultiGuard>> {
        self.try_lock_for(Duration::ZERO, None).await
    }

    /// As [`try_lock`](Self::try_lock), each part with a fixed `lease`.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), and lease errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock_with_lease(&self, lease: Duration) -> Result<Option<MultiGuard>> {
        self.try_lock_for(Duration::ZERO, Some(lease)).await
    }

    async fn lock_inner(&self, lease: Option<Duration>) -> Result<MultiGuard> {
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let taken = match lease {
                None => lock.lock().await,
                Some(l) => lock.lock_with_lease(l).await,
            };
            match taken {
                Ok(g) => guards.push(g),
                Err(e) => {
                    release_all(guards).await;
                    return Err(e);
                }
            }
        }
        Ok(self.guard(guards))
    }

    /// Tries for at most `wait` in all. `Ok(None)` when some part was not free in
    /// time; the parts already taken are released then.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock_for(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<MultiGuard>> {
        let wait = wait.min(crate::config::MAX_DURATION);
        let deadline = Instant::now() + wait;
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let left = deadline.saturating_duration_since(Instant::now());
            match lock.try_lock_for(left, lease).await {
                Ok(Some(g)) => guards.push(g),
                Ok(None) => {
                    release_all(guards).await;
                    return Ok(None);
                }
                Err(e) => {
                    release_all(guards).await;
                    return Err(e);
                }
            }
        }
        Ok(Some(self.guard(guards)))
    }

    fn guard(&self, guards: Vec<LockGuard>) -> MultiGuard {
        MultiGuard {
            needed: guards.len(),
            guards,
            valid_until: None,
        }
    }
}

/// The order parts are taken in: by name, then client, and the write half of a
/// read-write lock before its read half, since its owner may then read (a downgrade)
/// while a reader that asks to write is refused (`Error::UpgradeRefused`).
fn order_key(lock: &Lock) -> (&str, &str, u8, bool) {
    let rank = match lock.kind() {
        Kind::Write => 0,
        Kind::Read => 1,
        Kind::Plain => 2,
        Kind::Fair => 3,
    };
    // A fenced part and a plain one of one name are two parts: the fenced one's token
    // must not be dropped.
    (lock.name(), lock.client_id(), rank, lock.is_fenced())
}
