//! Locks over several instances or names: [`RedLock`] (a majority of independent
//! masters) and [`MultiLock`] (every one of several locks).
//!
//! Both are built from ordinary [`Lock`]s, so each part keeps its own reentrancy,
//! fencing token and watchdog: the client of each instance renews its part while the
//! combined guard is held.

use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::api::guard::LockGuard;
use crate::api::lock::Lock;
use crate::error::{Error, Result};

mod all;

/// A lock granted by a majority of independent Redis masters (the Redlock algorithm).
///
/// Give it one [`Lock`] per master, each from its own [`Client`](crate::Client),
/// usually all with the same name. An acquisition asks every master at once, each
/// with a short timeout, and counts the grants. It succeeds when at least
/// `n / 2 + 1` masters granted it and time is left of the lease after subtracting
/// the time spent and an allowance for clock drift (1 % of the lease plus 2 ms).
/// Otherwise every part that was granted is released, and it tries again after a
/// short random pause while the wait allows.
///
/// ```no_run
/// # async fn demo() -> redis_rlock::Result<()> {
/// use std::time::Duration;
/// use redis_rlock::{Client, RedLock};
/// let mut locks = Vec::new();
/// for url in ["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"] {
///     locks.push(Client::connect(url).await?.lock("orders:42"));
/// }
/// let redlock = RedLock::new(locks)?;
/// if let Some(guard) = redlock.try_lock_for(Duration::from_secs(1), None).await? {
///     // ... held on a majority of the masters ...
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedLock {
    locks: Vec<Lock>,
}

/// A lock over several locks that is held only when every one of them is held.
///
/// Use it to take several names at once, on one client or across clients. The parts
/// are taken one after another in a fixed order (by name, then by client id), so two
/// tasks that take overlapping sets cannot deadlock; when the wait runs out part-way,
/// the parts already taken are released. Redisson's `RedissonMultiLock` takes its locks
/// in the order given instead; the set held in the end is the same.
///
/// Both halves of one [`ReadWriteLock`](crate::ReadWriteLock) may be parts: the write
/// half is then taken first and the read half re-enters it (a downgrade), in whatever
/// order they were given, so the whole holds the lock alone. In the order `[read,
/// write]` Redisson would wait for itself forever, and this crate's write half alone
/// would refuse the upgrade ([`Error::UpgradeRefused`]).
///
/// ```no_run
/// # async fn demo() -> redis_rlock::Result<()> {
/// use redis_rlock::{Client, MultiLock};
/// let client = Client::connect("redis://127.0.0.1:6379").await?;
/// let both = MultiLock::new(vec![client.lock("account:1"), client.lock("account:2")])?;
/// let guard = both.lock().await?;
/// // ... move money between the two accounts ...
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MultiLock {
    locks: Vec<Lock>,
}

/// The guard of a [`RedLock`] or a [`MultiLock`]: the guards of the parts it holds.
///
/// Dropping it releases every part in the background, like dropping a [`LockGuard`].
#[derive(Debug)]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
    /// Parts that must stay held for the whole to count as held.
    needed: usize,
    /// When the validity computed at acquisition ends, for fixed leases.
    valid_until: Option<Instant>,
}

/// Time a single master may take to answer one acquisition of a [`RedLock`], as a
/// fraction of the lease (the algorithm wants it small beside the lease).
const PER_INSTANCE_SHARE: u32 = 10;

/// The least time a round of [`RedLock::try_lock_for`] gives a master near the wait's
/// end: an attempt cut shorter than a round trip could only fail.
const ROUND_FLOOR: Duration = Duration::from_millis(10);

fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

fn check_parts(locks: &[Lock]) -> Result<()> {
    if locks.is_empty() {
        return Err(Error::InvalidConfig(
            "a multi-lock needs at least one lock".into(),
        ));
    }
    Ok(())
}

impl RedLock {
    /// A RedLock over `locks`, one per independent master.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `locks` is empty or two of them come from the same
    /// client (a majority on one server would mean nothing).
    pub fn new(locks: Vec<Lock>) -> Result<RedLock> {
        check_parts(&locks)?;
        let mut ids: Vec<&str> = locks.iter().map(|l| l.client_id()).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != locks.len() {
            return Err(Error::InvalidConfig(
                "every lock of a RedLock must come from its own client (its own master)".into(),
            ));
        }
        Ok(RedLock { locks })
    }

    /// How many masters must grant the lock: `n / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.locks.len() / 2 + 1
    }

    /// Waits until a majority grants the lock; each client's watchdog renews its part.
    ///
    /// # Errors
    ///
    /// As [`try_lock_for`](Self::try_lock_for).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: parts granted to a dropped future are released in the background.
    pub async fn lock(&self) -> Result<MultiGuard> {
        self.lock_inner(None).await
    }

    /// Waits until a majority grants the lock with a fixed `lease` on each master.
    ///
    /// # Errors
    ///
    /// As [`try_lock_for`](Self::try_lock_for).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<MultiGuard> {
        self.lock_inner(Some(lease)).await
    }

    async fn lock_inner(&self, lease: Option<Duration>) -> Result<MultiGuard> {
        loop {
            if let Some(g) = self.try_lock_for(Duration::from_secs(3600), lease).await? {
                return Ok(g);
            }
        }
    }

    /// One round: `Ok(None)` unless a majority grants the lock at once; each client's
    /// watchdog renews its part.
    ///
    /// # Errors
    ///
    /// As [`try_lock_for`](Self::try_lock_for).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(&self) -> Result<Option<MultiGuard>> {
        self.round(None, None).await
    }

    /// One round with a fixed `lease` on each master.
    ///
    /// # Errors
    ///
    /// As [`try_lock_for`](Self::try_lock_for).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock_with_lease(&self, lease: Duration) -> Result<Option<MultiGuard>> {
        crate::config::check_lease(lease)?;
        self.round(Some(lease), None).await
    }

    /// Tries for at most `wait`. `Ok(None)` when no majority granted it in time. Each
    /// master's attempt is bounded by a tenth of the lease (at least 50 ms) and by what is
    /// left of the wait (at least 10 ms), so a stalled master does not hold the call past
    /// its deadline; a `wait` of zero is one round, as [`try_lock`](Self::try_lock).
    /// Errors of single masters count as refusals (a timed-out attempt is one); an error
    /// is returned only when every master failed with one.
    ///
    /// # Errors
    ///
    /// Input errors ([`Error::InvalidLease`], [`Error::DurationOutOfRange`]), and the
    /// first master's error when every master failed.
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
        if let Some(l) = lease {
            crate::config::check_lease(l)?;
        }
        if wait.is_zero() {
            return self.round(lease, None).await;
        }
        let deadline = Instant::now() + wait;
        loop {
            match self.round(lease, Some(deadline)).await? {
                Some(guard) => return Ok(Some(guard)),
                None => {
                    let pause = Duration::from_millis(10 + jitter_ms(40));
                    if Instant::now() + pause >= deadline {
                        return Ok(None);
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// One attempt at every master, each cut at `deadline` (but given at least
    /// [`ROUND_FLOOR`]) as well as at its share of the lease.
    async fn round(
        &self,
        lease: Option<Duration>,
        deadline: Option<Instant>,
    ) -> Result<Option<MultiGuard>> {
        let effective = lease.unwrap_or_else(|| {
            self.locks
                .iter()
                .map(|l| l.watchdog_timeout())
                .min()
                .unwrap_or_default()
        });
        let start = Instant::now();
        let mut per_instance = (effective / PER_INSTANCE_SHARE).max(Duration::from_millis(50));
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(start).max(ROUND_FLOOR);
            per_instance = per_instance.min(left);
        }
        let attempts = self.locks.iter().map(|lock| async move {
            // A timed-out attempt is dropped; its hold, if Redis granted one, is then
            // released in the background (see the cancellation notes on `Lock`).
            match tokio::time::timeout(per_instance, lock.try_lock_for(Duration::ZERO, lease)).await
            {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout {
                    op: "redlock attempt",
                    after: per_instance,
                }),
            }
        });
        let results = join_all(attempts).await;
        let elapsed = start.elapsed();
        let mut guards = Vec::new();
        let mut errors = Vec::new();
        for r in results {
            match r {
                Ok(Some(g)) => guards.push(g),
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        let validity = effective
            .checked_sub(elapsed)
            .and_then(|v| v.checked_sub(drift(effective)));
        if guards.len() >= self.quorum() {
            if let Some(v) = validity.filter(|v| !v.is_zero()) {
                return Ok(Some(MultiGuard {
                    guards,
                    needed: self.quorum(),
                    valid_until: lease.map(|_| start + v),
                }));
            }
        }
        release_all(guards).await;
        if errors.len() == self.locks.len() {
            return Err(errors.swap_remove(0));
        }
        Ok(None)
    }
}

impl MultiGuard {
    /// The guards of the parts held, one per granted lock.
    pub fn parts(&self) -> &[LockGuard] {
        &self.guards
    }

    /// True once fewer parts are held than the whole needs (a majority for a
    /// [`RedLock`], all for a [`MultiLock`]), or a fixed lease's validity ended.
    pub fn is_lost(&self) -> bool {
        if self.valid_until.is_some_and(|v| Instant::now() >= v) {
            return true;
        }
        let held = self.guards.iter().filter(|g| !g.is_lost()).count();
        held < self.needed
    }

    /// Completes when [`is_lost`](Self::is_lost) becomes true.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn lost(&self) {
        let expiry = async {
            match self.valid_until {
                Some(v) => tokio::time::sleep_until(v).await,
                None => std::future::pending().await,
            }
        };
        let parts = async {
            let mut pending: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
            let may_lose = self.guards.len() - self.needed;
            let mut lost = 0;
            while lost <= may_lose && !pending.is_empty() {
                let (_, _, rest) = futures_util::future::select_all(pending).await;
                pending = rest;
                lost += 1;
            }
            if lost <= may_lose {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = expiry => {}
            _ = parts => {}
        }
    }

    /// Releases every part, concurrently. Returns the first error, after all parts
    /// were tried.
    ///
    /// # Errors
    ///
    /// The first part's error, as [`LockGuard::unlock`] gives them
    /// ([`Error::LeaseLost`], [`Error::NotHeld`], transient errors); the other parts
    /// were released all the same.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockGuard::unlock`]: every part whose unlock was sent completes
    /// in the background; the others are released by their guards' drop.
    pub async fn unlock(mut self) -> Result<()> {
        let guards = std::mem::take(&mut self.guards);
        let results = join_all(guards.into_iter().map(|g| g.unlock())).await;
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}

async fn release_all(guards: Vec<LockGuard>) {
    for r in join_all(guards.into_iter().map(|g| g.unlock())).await {
        if let Err(e) = r {
            tracing::debug!(error = %e, "releasing a part of a multi-lock failed; it expires by its lease");
        }
    }
}

/// A small random number below `max`, from the randomness uuid already brings along.
fn jitter_ms(max: u64) -> u64 {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) % max.max(1)
}
