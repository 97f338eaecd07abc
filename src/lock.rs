//! The lock handle users call, and the guard they hold.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tracing::Instrument;

use crate::client::{Client, ClientInner, ReplicaSync, SyncFailure};
use crate::error::{Error, Result};
use crate::handover::{Grant, Offer, Ticket, Waiter, Woke};
use crate::identity::{holder_field, OwnerId};
use crate::inflight::{Completing, InFlightGuard};
use crate::raw::{self, Attempt, Release, ReleaseCall};
use crate::watchdog::{Released, SlotKey, WatchEntry};

/// Longest lock name accepted, in bytes. Redis would take more, but a name this long is
/// almost surely a bug, and every waiter and renewal would carry it.
pub const MAX_NAME_LEN: usize = 64 * 1024;

/// Longest lease, wait or timeout accepted: 2^62 ms (about 146 million years). Redis
/// rejects expiry times that overflow its signed 64-bit millisecond clock; this limit
/// keeps well inside it.
pub const MAX_DURATION: Duration = Duration::from_millis(1 << 62);

pub(crate) fn check_duration(what: &'static str, d: Duration) -> Result<()> {
    if d > MAX_DURATION {
        return Err(Error::DurationOutOfRange {
            what,
            duration: d,
            max: MAX_DURATION,
        });
    }
    Ok(())
}

pub(crate) fn check_lease(lease: Duration) -> Result<()> {
    if lease.is_zero() {
        return Err(Error::InvalidLease {
            lease,
            reason: "a zero lease would expire before anyone could use the lock",
        });
    }
    if lease < Duration::from_millis(1) {
        return Err(Error::InvalidLease {
            lease,
            reason: "Redis counts leases in whole milliseconds; the least is 1 ms",
        });
    }
    check_duration("lease", lease)
}

/// How long an acquisition may wait.
#[derive(Clone, Copy)]
enum Wait {
    /// One attempt.
    No,
    /// Until this instant (`None`: forever).
    Until(Option<Instant>),
}

/// A named distributed lock, reentrant per tokio task (see [`OwnerId`]; futures run
/// concurrently inside one task are one owner unless each runs in its own
/// [`OwnerId::scope`]).
///
/// Made by [`Client::lock`]; cheap to clone. Every method that takes the lock returns a
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
    client: Client,
    name: Arc<str>,
    channel: Arc<str>,
    token_key: Arc<str>,
    fenced: bool,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.name)
            .field("fenced", &self.fenced)
            .finish()
    }
}

impl Lock {
    pub(crate) fn new(client: Client, name: String, fenced: bool) -> Lock {
        let channel = raw::channel_name(&name).into();
        let token_key = raw::token_key(&name).into();
        Lock {
            client,
            name: name.into(),
            channel,
            token_key,
            fenced,
        }
    }

    /// Whether this is a fenced lock ([`Client::fenced_lock`]): every acquisition
    /// draws a fencing token.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// The lock's name, which is also its Redis key.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lock's pub/sub channel, `redisson_lock__channel:{<name>}`.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    pub(crate) fn client_id(&self) -> &str {
        &self.client.inner.id
    }

    pub(crate) fn watchdog_timeout(&self) -> Duration {
        self.client.inner.config.watchdog_timeout
    }

    fn check_name(&self) -> Result<()> {
        if self.name.is_empty() {
            return Err(Error::EmptyName);
        }
        if self.name.len() > MAX_NAME_LEN {
            return Err(Error::NameTooLong {
                len: self.name.len(),
                max: MAX_NAME_LEN,
            });
        }
        if self.inner().conn.is_cluster() && !raw::cluster_safe(&self.name) {
            return Err(Error::NameNotClusterSafe {
                name: self.name.to_string(),
            });
        }
        Ok(())
    }

    fn inner(&self) -> &Arc<ClientInner> {
        &self.client.inner
    }

    fn current_field(&self) -> (OwnerId, Arc<str>) {
        let owner = OwnerId::current();
        (owner, holder_field(&self.inner().id, owner).into())
    }

    /// Waits until the lock is taken. The lease is the client's watchdog timeout, and the
    /// watchdog renews it until the guard is released (see [`LockGuard::lost`]).
    ///
    /// Waits without limit; use [`try_lock_for`](Self::try_lock_for) to bound the wait.
    ///
    /// Re-entrant per owner (see [`OwnerId`]): a second `lock()` by the task (or thread)
    /// that holds the lock returns at once with another guard. A task spawned by the
    /// holder is another owner and waits.
    ///
    /// **Futures joined or selected inside one task** (`join!`, `select!`,
    /// `FuturesUnordered`) are *one* owner, so both enter. Run each in its own
    /// [`OwnerId::scope`] (or its own task) when they must exclude each other:
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
    /// Cancel safe: dropping the future leaves no hold and no subscription behind. An
    /// acquire already sent finishes in the background, and a hold it took is released
    /// there.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn lock(&self) -> Result<LockGuard> {
        self.acquire_unbounded(None).await
    }

    /// Waits until the lock is taken, with a fixed lease and no watchdog: the lock
    /// expires `lease` after it was taken unless released before. Re-entry adds a hold
    /// and never shortens a longer lease the holder already has.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), and [`Error::InvalidLease`] or
    /// [`Error::DurationOutOfRange`] for a lease under 1 ms or beyond
    /// [`MAX_DURATION`].
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
        self.acquire_unbounded(Some(lease)).await
    }

    /// One attempt, no waiting. `Ok(None)` when someone else holds the lock. The lock is
    /// kept by the watchdog.
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
        self.acquire(None, Wait::No).await
    }

    /// Tries for at most `wait` (Redisson's `tryLock(wait, lease)`). `lease: None` means
    /// a watchdog lease; `Some(lease)` a fixed one. Returns `Ok(None)` once `wait` has
    /// passed, measured on the monotonic clock, without the lock. A zero `wait` makes one
    /// attempt, as [`try_lock`](Self::try_lock).
    ///
    /// # Errors
    ///
    /// As [`lock_with_lease`](Self::lock_with_lease), and
    /// [`Error::DurationOutOfRange`] for a `wait` beyond [`MAX_DURATION`]. A Redis that
    /// stalls past the deadline gives `Ok(None)`, not an error.
    ///
    /// # Time
    ///
    /// Returns by `now + wait` plus a few ms (measured: 200 ms waits returned after
    /// 200-203 ms while Redis was stopped), even with an attempt in flight at the
    /// deadline: that attempt finishes in the background.
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
        check_duration("wait", wait)?;
        let until = Instant::now().checked_add(wait);
        self.acquire(
            lease,
            if wait.is_zero() {
                Wait::No
            } else {
                Wait::Until(until)
            },
        )
        .await
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
        self.acquire(Some(lease), Wait::No).await
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
        self.acquire(lease, wait).await
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
                    name: self.name.to_string(),
                })
            }
        };
        guard.unlock().await?;
        Ok(out)
    }

    async fn acquire_unbounded(&self, lease: Option<Duration>) -> Result<LockGuard> {
        // A wait without a deadline only ends with the lock or an error; the loop states
        // that without an internal error nobody could act on.
        loop {
            if let Some(guard) = self.acquire(lease, Wait::Until(None)).await? {
                return Ok(guard);
            }
        }
    }

    async fn acquire(&self, lease: Option<Duration>, wait: Wait) -> Result<Option<LockGuard>> {
        self.check_name()?;
        self.inner().check_open()?;
        if let Some(l) = lease {
            check_lease(l)?;
        }
        let (owner, field) = self.current_field();
        let span = tracing::debug_span!("acquire", lock = %self.name, owner = %field);
        self.acquire_as(owner, field, lease, wait)
            .instrument(span)
            .await
    }

    async fn acquire_as(
        &self,
        owner: OwnerId,
        field: Arc<str>,
        lease: Option<Duration>,
        wait: Wait,
    ) -> Result<Option<LockGuard>> {
        // Where this client's own waiters already queue for the name, a new waiter
        // defers to them; a holder never does (its re-entry must go through).
        let mut behind = None;
        if let Wait::Until(deadline) = wait {
            let inner = self.inner();
            let handover = &inner.handover;
            let holder = || {
                inner.watchdog.is_registered(&self.name, &field)
                    || inner.fixed.holds(&self.name, &field)
            };
            if let Some(until) = handover.held_back(&self.name) {
                // This client just ended a run of hand-overs on the name: the waiters
                // the release woke (in other clients too) go first.
                if !holder() {
                    tokio::time::sleep_until(deadline.map_or(until, |d| d.min(until))).await;
                }
            } else if let Some(until) = inner
                .hands_over()
                .then(|| handover.behind(&self.name))
                .flatten()
            {
                // Others of this client sleep on it, so it is held until at least `until`
                // as far as anyone here knows: join the queue without asking Redis.
                if !holder() {
                    behind = Some(until.saturating_duration_since(Instant::now()));
                }
            }
        }
        let mut ttl = match behind {
            Some(left) => Some(left),
            None => match self
                .attempt_within(owner, &field, lease, false, wait)
                .await?
            {
                Some(Tried::Held(guard)) => return Ok(Some(guard)),
                Some(Tried::Busy(ttl)) => ttl,
                Some(Tried::Late(took)) if matches!(wait, Wait::No) => {
                    return Err(Error::Timeout {
                        op: "try_lock (granted after its lease ran out)",
                        after: took,
                    })
                }
                // Given back already; try again as soon as the holder's lease allows.
                Some(Tried::Late(_)) => Some(Duration::ZERO),
                None if matches!(wait, Wait::No) => {
                    return Err(Error::Timeout {
                        op: "try_lock",
                        after: self.inner().config.response_timeout,
                    })
                }
                None => return Ok(None),
            },
        };
        let deadline = match wait {
            Wait::No => return Ok(None),
            Wait::Until(d) => d,
        };
        tracing::debug!(?ttl, "lock busy; waiting");
        let started = Instant::now();
        let mut sub = self.inner().pubsub.subscribe(&self.channel, &self.name);
        // The unlock may have happened between the first attempt and the subscription;
        // the attempt right after the SUBSCRIBE is confirmed covers that window.
        let Some(bound) = self.bound(ttl, deadline) else {
            return Ok(None);
        };
        sub.ready(bound).await;
        let mut queued = Queued {
            waiter: self.inner().handover.waiter(
                &self.name,
                &field,
                lease.unwrap_or(self.inner().config.watchdog_timeout),
                self.fenced,
            ),
            inner: self.inner().clone(),
            hold: self.hold(&field),
        };
        // Start of the current run of transient errors, if in one.
        let mut failing_since: Option<Instant> = None;
        // A waiter that joined the queue without an attempt sleeps first.
        let mut skip_attempt = behind.is_some();
        // Set when a failed unlock may have handed this task the lock.
        let mut adopt = false;
        loop {
            let mut lease_ends = None;
            let tried = if std::mem::take(&mut skip_attempt) {
                None
            } else {
                Some(self.attempt_within(owner, &field, lease, adopt, wait).await)
            };
            match tried {
                None => {}
                Some(Ok(None)) => {
                    tracing::debug!(waited = ?started.elapsed(), "wait ran out during an attempt");
                    return Ok(None);
                }
                Some(Ok(Some(Tried::Held(guard)))) => {
                    sub.wake_used();
                    // `adopt` is over once an attempt got an answer.
                    tracing::debug!(waited = ?started.elapsed(), "acquired after waiting");
                    return Ok(Some(guard));
                }
                Some(Ok(Some(Tried::Late(_)))) => {
                    sub.wake_used();
                    adopt = false;
                    failing_since = None;
                    ttl = Some(Duration::ZERO);
                }
                Some(Ok(Some(Tried::Busy(t)))) => {
                    sub.wake_used();
                    adopt = false;
                    failing_since = None;
                    ttl = t;
                    lease_ends = t.map(|t| Instant::now() + t);
                }
                Some(Err(e)) if e.is_transient() => {
                    // A waiter rides out a failover or reconnect: the lock it waits for
                    // is still there, on whichever node serves it next.
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.inner().config.retry_window {
                        return Err(e);
                    }
                    tracing::debug!(error = %e, "transient error while waiting; retrying");
                    let pause = Duration::from_millis(50)
                        .max(since.elapsed() / 4)
                        .min(Duration::from_millis(500));
                    ttl = Some(pause);
                }
                Some(Err(e)) => return Err(e),
            }
            let Some(bound) = self.bound(ttl, deadline) else {
                tracing::debug!(waited = ?started.elapsed(), "wait ran out");
                return Ok(None);
            };
            // Asleep, this task may be handed the lock by an unlock of this client.
            queued.waiter.park(lease_ends);
            tokio::select! {
                _ = sub.woken(bound) => {}
                _ = queued.waiter.picked() => {}
                _ = self.inner().closed.wait() => {}
            }
            let woke = match queued.waiter.unpark() {
                Woke::Offered => {
                    // The unlock's reply settles it within the unlock's own timeouts, as
                    // long as its future is polled; past those, this task stops waiting.
                    let bound = self.inner().offer_bound();
                    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                    let limit = left.map_or(bound, |l| l.min(bound));
                    match tokio::time::timeout(limit, queued.waiter.outcome()).await {
                        Ok(w) => w,
                        // Dropping `queued` leaves the offer to the unlocker, which
                        // releases the hold if it was granted.
                        Err(_) if left.is_some_and(|l| l <= bound) => return Ok(None),
                        // Only when the unlock's future is not being polled: this task
                        // acquires on its own (see `Waiter::abandon_offer`), adopting
                        // the grant if it is there by now.
                        Err(_) => match queued.waiter.abandon_offer() {
                            Woke::Free => Woke::Unsure,
                            w => w,
                        },
                    }
                }
                w => w,
            };
            let grant = match woke {
                Woke::Granted(g) => Some(g),
                Woke::Unsure => {
                    adopt = true;
                    None
                }
                Woke::Free | Woke::Offered => None,
            };
            if let Some(g) = grant {
                sub.wake_used();
                let granted = lease.unwrap_or(self.inner().config.watchdog_timeout);
                if g.sent + granted <= Instant::now() {
                    // As for an acquire answered too late: a guard would be lost on
                    // arrival. The hold is given back and the wait goes on.
                    tracing::debug!(token = g.token, "hand-over arrived after its lease ran out");
                    release_detached(self.inner().clone(), self.hold(&field));
                    ttl = Some(Duration::ZERO);
                    continue;
                }
                tracing::debug!(waited = ?started.elapsed(), token = g.token, "lock handed over");
                return Ok(Some(self.held(
                    self.hold(&field),
                    owner,
                    lease,
                    g.sent,
                    g.token,
                )));
            }
        }
    }

    /// How long to sleep before the next attempt: until the holder's lease runs out or
    /// the deadline comes, whichever is first. `None` when the deadline has passed.
    fn bound(&self, ttl: Option<Duration>, deadline: Option<Instant>) -> Option<Duration> {
        // A key without expiry was not written by a lease lock; check back now and then.
        let ttl = ttl
            .unwrap_or(self.inner().config.watchdog_timeout)
            .max(Duration::from_millis(1));
        match deadline {
            None => Some(ttl),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    None
                } else {
                    Some(ttl.min(left))
                }
            }
        }
    }

    /// [`attempt`](Self::attempt), bounded: by the deadline of a waiting call, and by one
    /// response timeout for a single try. `None` when the bound came first; an attempt
    /// already sent then finishes in the background, and a hold it took is given back.
    async fn attempt_within(
        &self,
        owner: OwnerId,
        field: &Arc<str>,
        lease: Option<Duration>,
        adopt: bool,
        wait: Wait,
    ) -> Result<Option<Tried>> {
        self.inner().check_open()?;
        let until = match wait {
            Wait::No => Instant::now().checked_add(self.inner().config.response_timeout),
            Wait::Until(deadline) => deadline,
        };
        let attempt = self.attempt(owner, field, lease, adopt);
        match until {
            None => attempt.await.map(Some),
            Some(at) => match tokio::time::timeout_at(at, attempt).await {
                Ok(tried) => tried.map(Some),
                Err(_) => Ok(None),
            },
        }
    }

    /// One acquire: a local re-entry of a live watchdog hold, or else one request to
    /// Redis (retried with the same request id when its reply may have been lost).
    /// `Err(ttl)` (inside `Ok`) when the lock is busy.
    /// `adopt`: a failed unlock may have handed this task the lock; the request is then
    /// sent as a retry, which adopts such a hold instead of taking a second one.
    async fn attempt(
        &self,
        owner: OwnerId,
        field: &Arc<str>,
        lease: Option<Duration>,
        adopt: bool,
    ) -> Result<Tried> {
        let inner = self.inner().clone();
        // What the client knows of this field's holds is only settled once its earlier
        // requests are (see `InFlight`).
        if inner.inflight.busy(&self.name, field) {
            // Boxed: rarely taken, and every waiting task carries this future.
            Box::pin(
                inner
                    .inflight
                    .settled(&self.name, field, inner.offer_bound()),
            )
            .await;
        }
        let hold = self.hold(field);
        let registered = match lease {
            // A fenced re-entry draws a token of its own in Redis, as Redisson's does.
            None if !self.fenced => match inner.watchdog.reenter(&self.name, field) {
                Ok(entry) => {
                    tracing::debug!(token = entry.token, "re-entered a held lock locally");
                    let token = entry.token;
                    return Ok(Tried::Held(self.guard(
                        hold,
                        owner,
                        token,
                        GuardKind::Watchdog(entry),
                    )));
                }
                Err(registered) => registered,
            },
            _ => inner.watchdog.is_registered(&self.name, field),
        };
        let effective = lease.unwrap_or(inner.config.watchdog_timeout);
        let fresh = !registered && !inner.fixed.holds(&self.name, field);
        let in_flight = inner.inflight.begin(&self.name, field);
        let request = {
            let (inner, hold) = (inner.clone(), hold.clone());
            async move {
                let _in_flight = in_flight;
                let latch = raw::acquire_latch_key(&hold.name, &raw::request_id());
                let mut call = raw::AcquireCall {
                    name: &hold.name,
                    token_key: &hold.token_key,
                    latch: &latch,
                    field: &hold.field,
                    lease: effective,
                    latch_ttl: inner.latch_ttl(),
                    fresh,
                    retry: adopt && fresh,
                    fenced: hold.fenced,
                };
                let sync_retries = match inner.conn.sync() {
                    ReplicaSync::Wait {
                        on_failure: SyncFailure::Retry { attempts },
                        ..
                    } => *attempts,
                    _ => 0,
                };
                let (mut attempt, mut unsynced) = (0, 0);
                loop {
                    attempt += 1;
                    // The script that answers starts the lease afresh (a retry that
                    // recognises the first grant renews it), so the lease is counted
                    // from the send that got the answer.
                    let sent = Instant::now();
                    match raw::acquire(&inner.conn, &call).await {
                        Err(e) if e.may_have_run() && attempt < ATTEMPTS => {
                            tracing::debug!(attempt, error = %e, "acquire reply lost; retrying with the same request id");
                            call.retry = true;
                            tokio::time::sleep(Duration::from_millis(20 * attempt as u64)).await;
                        }
                        // Rolled back, so the same request id starts afresh.
                        Err(Error::NotReplicated { .. }) if unsynced < sync_retries => {
                            unsynced += 1;
                            call.retry = false;
                            tokio::time::sleep(Duration::from_millis(50 * unsynced as u64)).await;
                        }
                        other => {
                            if let Ok(Attempt::Acquired { latched: true, .. }) = &other {
                                // The latch only matters to retries of this call, which are over.
                                inner.janitor.discard(latch);
                            }
                            if matches!(&other, Ok(Attempt::Acquired { .. }))
                                && inner.closed.is_set()
                            {
                                // The client shut down meanwhile, and released what it
                                // held: this hold would be nobody's.
                                undo_grant(&inner, &hold).await;
                                return Err(Error::Closed);
                            }
                            if matches!(&other, Err(e) if e.may_have_run()) && fresh {
                                // The last send may have granted what nobody will hold: a
                                // first hold is the field itself, so giving it back is safe.
                                undo_grant(&inner, &hold).await;
                            }
                            return other.map(|a| (a, sent));
                        }
                    }
                }
            }
        };
        let orphan = {
            let (inner, hold) = (inner.clone(), hold.clone());
            move |outcome: Result<(Attempt, Instant)>| async move {
                if let Ok((Attempt::Acquired { .. }, _)) = outcome {
                    undo_grant(&inner, &hold).await;
                }
            }
        };
        let (outcome, sent) = Completing::new(inner.spawner(), request, orphan).await?;
        match outcome {
            Attempt::Busy(ttl) => Ok(Tried::Busy(ttl)),
            Attempt::Acquired { .. } if sent + effective <= Instant::now() => {
                // The answer came after the lease it granted had run out (Redis stalled,
                // or this future was not polled): the lock may be someone else's by now,
                // and a guard would be lost on arrival. What is left of the hold goes.
                tracing::debug!(lease = ?effective, "grant arrived after its lease ran out");
                let in_flight = inner.inflight.begin(&self.name, field);
                let undo = {
                    let inner = inner.clone();
                    async move {
                        let _in_flight = in_flight;
                        undo_grant(&inner, &hold).await;
                    }
                };
                inner.spawner().errand(undo);
                Ok(Tried::Late(sent.elapsed()))
            }
            Attempt::Acquired { token, .. } => {
                tracing::debug!(lease = ?effective, watchdog = lease.is_none(), token, "lock acquired");
                Ok(Tried::Held(self.held(hold, owner, lease, sent, token)))
            }
        }
    }

    fn hold(&self, field: &Arc<str>) -> Hold {
        Hold {
            name: self.name.clone(),
            channel: self.channel.clone(),
            token_key: self.token_key.clone(),
            field: field.clone(),
            fenced: self.fenced,
        }
    }

    /// The guard of a hold just taken in Redis by a request sent at `sent`: registered
    /// with the watchdog, or counted as a fixed-lease hold.
    fn held(
        &self,
        hold: Hold,
        owner: OwnerId,
        lease: Option<Duration>,
        sent: Instant,
        token: u64,
    ) -> LockGuard {
        let inner = self.inner();
        let kind = match lease {
            None => GuardKind::Watchdog(inner.watchdog.register(
                &self.name,
                &hold.field,
                sent,
                token,
            )),
            Some(l) => {
                inner.fixed.add(&self.name, &hold.field);
                GuardKind::Lease { expires: sent + l }
            }
        };
        self.guard(hold, owner, token, kind)
    }

    /// `token` is what the script replied: 0 for a plain lock.
    fn guard(&self, hold: Hold, owner: OwnerId, token: u64, kind: GuardKind) -> LockGuard {
        LockGuard {
            state: Some(GuardState {
                token: hold.fenced.then_some(token),
                lock: self.clone(),
                hold,
                owner,
                kind,
            }),
        }
    }

    /// Deletes the lock whoever holds it, and wakes its waiters (Redisson's
    /// `forceUnlock`). Returns whether a lock was deleted. Guards of this client on this
    /// name report [`lost`](LockGuard::lost).
    ///
    /// # Errors
    ///
    /// Name errors as for [`lock`](Self::lock); [`Error::PermissionDenied`] when ACL
    /// forbids the publish (nothing is deleted then); transient errors as they come.
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
        self.check_name()?;
        let inner = self.inner();
        inner.watchdog.forget_name(&self.name);
        let deleted = raw::force_release(&inner.conn, &self.name, &self.channel).await?;
        tracing::debug!(lock = %self.name, deleted, "force unlock");
        Ok(deleted)
    }

    /// Whether anyone holds the lock now. One round trip, bounded by the response
    /// timeout.
    ///
    /// # Errors
    ///
    /// Name errors as for [`lock`](Self::lock); transient errors as they come.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn is_locked(&self) -> Result<bool> {
        self.check_name()?;
        let reply = raw::query(
            &self.inner().conn,
            &self.name,
            redis::cmd("EXISTS").arg(&*self.name).clone(),
        )
        .await?;
        Ok(reply == redis::Value::Int(1))
    }

    /// Whether the calling task (or thread) holds the lock.
    ///
    /// # Errors
    ///
    /// As [`hold_count`](Self::hold_count).
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn is_held_by_current_task(&self) -> Result<bool> {
        Ok(self.hold_count().await? > 0)
    }

    /// How many holds the calling task (or thread) has on the lock; 0 if none. This is
    /// the hash's count plus the watchdog re-entries this client keeps locally.
    ///
    /// # Errors
    ///
    /// Name errors as for [`lock`](Self::lock); [`Error::WrongType`] when the key is
    /// not a lock hash; transient errors as they come.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn hold_count(&self) -> Result<u32> {
        self.check_name()?;
        let (_, field) = self.current_field();
        let local = self.inner().watchdog.local_holds(&self.name, &field);
        let reply = raw::query(
            &self.inner().conn,
            &self.name,
            redis::cmd("HGET").arg(&*self.name).arg(&*field).clone(),
        )
        .await?;
        let remote = redis::from_redis_value::<Option<u32>>(reply)
            .map_err(|e| Error::Redis(e.into()))?
            .unwrap_or(0);
        Ok(if remote == 0 { 0 } else { remote + local })
    }

    /// Time until the lock expires: `None` when it is not locked. A key without expiry
    /// (not written by a lease lock) reports `Duration::MAX`.
    ///
    /// # Errors
    ///
    /// Name errors as for [`lock`](Self::lock); transient errors as they come.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        self.check_name()?;
        let reply = raw::query(
            &self.inner().conn,
            &self.name,
            redis::cmd("PTTL").arg(&*self.name).clone(),
        )
        .await?;
        let ms: i64 = redis::from_redis_value(reply).map_err(|e| Error::Redis(e.into()))?;
        Ok(match ms {
            -2 => None,
            ms if ms < 0 => Some(Duration::MAX),
            ms => Some(Duration::from_millis(ms as u64)),
        })
    }
}

/// What one acquire attempt found.
enum Tried {
    /// The lock is taken.
    Held(LockGuard),
    /// Someone else holds it, for this long as far as Redis said (`None`: no expiry).
    Busy(Option<Duration>),
    /// The grant arrived after the lease it granted had run out, so it was given back;
    /// the value is how long the answer took.
    Late(Duration),
}

/// How many times one acquire or unlock is sent when its reply may have been lost
/// (timeout, broken connection).
const ATTEMPTS: u32 = 3;

/// What identifies one hold on the server.
#[derive(Clone)]
struct Hold {
    name: Arc<str>,
    channel: Arc<str>,
    token_key: Arc<str>,
    field: Arc<str>,
    fenced: bool,
}

/// A waiter's place in the hand-over queue, for as long as it waits.
struct Queued {
    waiter: Waiter,
    inner: Arc<ClientInner>,
    hold: Hold,
}

impl Drop for Queued {
    fn drop(&mut self) {
        // A grant that arrived after the waiter stopped looking is still a hold in Redis.
        if let Some(g) = self.waiter.leave() {
            tracing::debug!(lock = %self.hold.name, token = g.token, "releasing a hand-over nobody took");
            release_detached(self.inner.clone(), self.hold.clone());
        }
    }
}

/// Gives back one hold taken by an acquire whose caller will not use it.
async fn undo_grant(inner: &Arc<ClientInner>, hold: &Hold) {
    let keep = inner
        .watchdog
        .is_registered(&hold.name, &hold.field)
        .then(|| inner.watchdog.lease());
    let undo = release_hold(inner, hold, keep, 1).await;
    tracing::debug!(lock = %hold.name, ?undo, "released a hold nobody will use");
}

/// Releases a hold nobody will use, in the background.
fn release_detached(inner: Arc<ClientInner>, hold: Hold) {
    // In flight from now, not from the task's first poll: an acquire of the same field
    // must wait for it (see `InFlight`).
    let in_flight = inner.inflight.begin(&hold.name, &hold.field);
    inner.clone().spawner().errand(async move {
        let _in_flight = in_flight;
        let r = release_hold(&inner, &hold, None, 1).await;
        tracing::debug!(lock = %hold.name, outcome = ?r, "released an unused hold");
    });
}

/// An offer riding on a release. Settled by `send_release`; if it is dropped unsettled
/// (the runtime went away), the waiter is freed.
struct Offered {
    ticket: Arc<Ticket>,
    inner: Arc<ClientInner>,
    name: Arc<str>,
    settled: bool,
}

impl Offered {
    /// The release did not hand over; it does not count toward the run either.
    fn withdraw(&mut self, unsure: bool) {
        self.settled = true;
        self.inner.handover.withdraw(&self.name);
        if unsure {
            self.ticket.unsure();
        } else {
            self.ticket.revert();
        }
    }
}

impl Drop for Offered {
    fn drop(&mut self) {
        if !self.settled {
            self.withdraw(false);
        }
    }
}

/// Fixed-lease holds this client has taken in Redis, per `(name, holder field)`. With
/// the watchdog's registry it tells whether an acquire is the holder's first, which
/// decides whether the acquire script must latch the request (`lua/acquire.lua`).
#[derive(Default)]
pub(crate) struct FixedHolds {
    counts: Mutex<HashMap<SlotKey, u32>>,
}

impl FixedHolds {
    fn add(&self, name: &Arc<str>, field: &Arc<str>) {
        *self
            .counts
            .lock()
            .entry((name.clone(), field.clone()))
            .or_insert(0) += 1;
    }

    fn remove(&self, name: &Arc<str>, field: &Arc<str>) {
        let mut counts = self.counts.lock();
        let key = (name.clone(), field.clone());
        if let Some(n) = counts.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&key);
            }
        }
    }

    fn holds(&self, name: &Arc<str>, field: &Arc<str>) -> bool {
        self.counts
            .lock()
            .contains_key(&(name.clone(), field.clone()))
    }

    /// Forgets every hold (the client shuts down); returns their `(name, field)`.
    pub(crate) fn drain(&self) -> Vec<SlotKey> {
        self.counts.lock().drain().map(|(key, _)| key).collect()
    }
}

/// Releases everything `field` holds on `name` (the client shuts down), and wakes the
/// lock's waiters if that frees it.
pub(crate) async fn release_field(
    inner: &Arc<ClientInner>,
    name: &Arc<str>,
    field: &Arc<str>,
) -> Result<()> {
    let hold = Hold {
        name: name.clone(),
        channel: raw::channel_name(name).into(),
        token_key: raw::token_key(name).into(),
        field: field.clone(),
        // No hand-over at shutdown, so the counter is not touched either way.
        fenced: false,
    };
    release_hold(inner, &hold, None, u32::MAX).await.map(|_| ())
}

/// Gives back `holds` of the hash's count; when that may be the last hold, hands the lock
/// to the oldest sleeping waiter of this client if there is one (see [`crate::handover`]).
async fn release_hold(
    inner: &Arc<ClientInner>,
    hold: &Hold,
    keep: Option<Duration>,
    holds: u32,
) -> Result<Release> {
    let _in_flight = inner.inflight.begin(&hold.name, &hold.field);
    // Holds this client still counts for the field make this release partial: offering
    // the lock with it would only wake a waiter for nothing.
    let last = keep.is_none()
        && !inner.watchdog.is_registered(&hold.name, &hold.field)
        && !inner.fixed.holds(&hold.name, &hold.field);
    // A client shutting down hands nothing to its waiters: they are leaving.
    let plan = if last && inner.hands_over() && !inner.closed.is_set() {
        inner.handover.offer(&hold.name)
    } else {
        Offer::Publish
    };
    match plan {
        Offer::To(ticket) => {
            let offer = Offered {
                ticket,
                inner: inner.clone(),
                name: hold.name.clone(),
                settled: false,
            };
            send_release(inner, hold, keep, holds, Some(offer), false).await
        }
        Offer::EndStreak => send_release(inner, hold, keep, holds, None, true).await,
        Offer::Publish => send_release(inner, hold, keep, holds, None, false).await,
    }
}

/// Sends one release and settles the offer riding on it. A transient failure is retried
/// with the same request id, so a retry of an unlock that did run replays its outcome
/// instead of counting down twice (or handing over twice).
async fn send_release(
    inner: &Arc<ClientInner>,
    hold: &Hold,
    keep: Option<Duration>,
    holds: u32,
    mut offer: Option<Offered>,
    ends_streak: bool,
) -> Result<Release> {
    let sent = Instant::now();
    let latch = raw::latch_key(&hold.name, &raw::request_id());
    let mut call = ReleaseCall {
        name: &hold.name,
        channel: &hold.channel,
        token_key: &hold.token_key,
        latch: &latch,
        field: &hold.field,
        next: offer.as_ref().map(|o| (&*o.ticket.field, o.ticket.lease)),
        keep,
        holds,
        latch_ttl: inner.latch_ttl(),
        retry: false,
        // A fenced waiter's grant needs a token even if the releasing handle is plain.
        fenced: hold.fenced || offer.as_ref().is_some_and(|o| o.ticket.fenced),
    };
    let mut attempt = 0;
    let outcome = loop {
        attempt += 1;
        match raw::release(&inner.conn, &call).await {
            // A published full release writes no latch: the field is gone because the
            // lost first send released it.
            Ok(Release::NotHeld) if call.retry => break Ok(Release::Released),
            Ok(r) => {
                if matches!(r, Release::StillHeld | Release::HandedOver { .. }) {
                    // The latch only matters to retries of this call, which are over.
                    inner.janitor.discard(latch);
                }
                break Ok(r);
            }
            Err(e) if e.may_have_run() && attempt < ATTEMPTS => {
                tracing::debug!(attempt, error = %e, "unlock reply lost; retrying with the same request id");
                call.retry = true;
                tokio::time::sleep(Duration::from_millis(20 * attempt as u64)).await;
            }
            Err(e) => break Err(e),
        }
    };
    if ends_streak && outcome.as_ref().is_ok_and(|r| *r == Release::Released) {
        // Two round trips: the message's way to the other waiters and their acquire.
        // Capped: a slow (retried) unlock says little about the round trip.
        let period = (sent.elapsed() * 2).min(Duration::from_millis(20));
        inner.handover.hold_back(&hold.name, period);
    }
    if let Some(mut o) = offer.take() {
        match &outcome {
            Ok(Release::HandedOver { token }) => {
                o.settled = true;
                if !o.ticket.deliver(Grant {
                    token: *token,
                    sent,
                }) {
                    // The waiter left meanwhile: the hold is ours to give back.
                    release_detached(
                        inner.clone(),
                        Hold {
                            field: o.ticket.field.clone(),
                            ..hold.clone()
                        },
                    );
                }
            }
            Ok(_) => o.withdraw(false),
            // Maybe it ran: the waiter adopts what it may have been given.
            Err(_) => o.withdraw(true),
        }
    }
    outcome
}

enum GuardKind {
    /// Renewed by the watchdog; lost when the watchdog says so.
    Watchdog(Arc<WatchEntry>),
    /// Fixed lease; surely gone at `expires` (measured from when the acquire was sent).
    Lease { expires: Instant },
}

struct GuardState {
    /// The handle it was taken through (its client keeps the client alive).
    lock: Lock,
    hold: Hold,
    owner: OwnerId,
    /// `None` for a plain lock.
    token: Option<u64>,
    kind: GuardKind,
}

/// One hold of a [`Lock`].
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
    fn state(&self) -> &GuardState {
        // Only unlock() and drop() take the state, and both consume the guard.
        self.state
            .as_ref()
            .expect("guard state is present until unlock or drop")
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.state().hold.name
    }

    /// The [`Lock`] this guard was taken through (as tokio's `MutexGuard::mutex`). An
    /// associated function, not a method, so that `guard.lock()` cannot be mistaken for
    /// taking the lock again.
    pub fn lock(this: &Self) -> &Lock {
        &this.state().lock
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
    /// [`Client::fenced_lock`]: larger than every token issued before for this lock
    /// name, by any client (Redisson's `RFencedLock` included). Pass it to the protected
    /// resource, which should refuse any token lower than the highest it has seen (see
    /// [`docs::guarantees`](crate::docs::guarantees)). `None` for a plain lock ([`Client::lock`]), which, like
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
    /// or the lease the client last confirmed has run out (for a fixed lease: the
    /// lease). That lease is counted on the monotonic clock from the send of the request
    /// that confirmed it, so this turns true no later than the key can expire on Redis,
    /// whether or not the watchdog could run meanwhile (a blocked thread, a paused
    /// process, a stalled Redis). Once true, it stays true.
    ///
    /// Check it right before a write the lock protects; what a pause *after* the check
    /// can do only a fencing token stops (see [`fencing_token`](Self::fencing_token)).
    pub fn is_lost(&self) -> bool {
        let state = self.state();
        if state.lock.client.inner.closed.is_set() {
            // The client's shutdown released it.
            return true;
        }
        match &state.kind {
            GuardKind::Watchdog(e) => state.lock.client.inner.watchdog.check_lost(e),
            GuardKind::Lease { expires } => Instant::now() >= *expires,
        }
    }

    /// Completes when the lock is lost (see [`is_lost`](Self::is_lost)), at the latest
    /// when the confirmed lease runs out; pending while it is held. Race it against the
    /// critical section to stop work that is no longer protected:
    ///
    /// ```no_run
    /// # async fn demo(lock: redis_rlock::Lock) -> redis_rlock::Result<()> {
    /// # async fn long_job() {}
    /// let guard = lock.lock().await?;
    /// tokio::select! {
    ///     _ = long_job() => guard.unlock().await?,
    ///     _ = guard.lost() => eprintln!("lock lost; job abandoned"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) {
        let state = self.state();
        let lost = async {
            match &state.kind {
                GuardKind::Watchdog(e) => state.lock.client.inner.watchdog.lost(e).await,
                GuardKind::Lease { expires } => tokio::time::sleep_until(*expires).await,
            }
        };
        tokio::select! {
            _ = lost => {}
            _ = state.lock.client.inner.closed.wait() => {}
        }
    }

    /// Releases this hold and reports the outcome.
    ///
    /// # Errors
    ///
    /// - [`Error::NotHeld`]: the lock had expired or was taken over before.
    /// - [`Error::LeaseLost`]: the guard already knew it was lost. Whatever Redis may
    ///   still keep under this holder's field (a renewal that landed after the client
    ///   gave up on the lease) is deleted all the same, unless another hold or request
    ///   of the same owner uses the field.
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
        state.lock.client.inner.check_open()?;
        let span =
            tracing::debug_span!("release", lock = %state.hold.name, owner = %state.hold.field);
        async move {
            let (holds, keep) = match state.begin_release() {
                Step::Lost { sweep } => {
                    if let Some(in_flight) = sweep {
                        let inner = state.lock.client.inner.clone();
                        let outcome = sweep_lost(inner, state.hold.clone(), in_flight).await;
                        tracing::debug!(?outcome, "swept the field of a lost hold");
                    }
                    return Err(Error::LeaseLost {
                        name: state.hold.name.to_string(),
                    });
                }
                Step::Local => {
                    tracing::debug!("released a local re-entry");
                    return Ok(());
                }
                Step::Send { holds, keep } => (holds, keep),
            };
            let inner = state.lock.client.inner.clone();
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

/// What releasing one guard leaves to do.
enum Step {
    /// Another guard of the same watchdog hold remains: nothing to send.
    Local,
    /// The hold is known lost. `sweep`: no other request or hold of this client has the
    /// field, so whatever Redis still keeps under it is this lost hold's (a renewal
    /// that landed after the client gave up on the lease), and is deleted.
    Lost { sweep: Option<InFlightGuard> },
    /// Give back `holds` of the hash's count, setting `keep` as lease if holds remain.
    Send { holds: u32, keep: Option<Duration> },
}

impl GuardState {
    /// Deregisters this hold, synchronously, before anything is sent, so that no renewal
    /// is scheduled after the unlock.
    fn begin_release(&self) -> Step {
        let inner = &self.lock.client.inner;
        let wd = &inner.watchdog;
        match &self.kind {
            GuardKind::Watchdog(entry) => {
                let lost = wd.check_lost(entry);
                match wd.release(entry) {
                    Released::Kept if !lost => Step::Local,
                    // Fixed-lease holds may remain: their lease stays as the watchdog left it.
                    Released::Last { remote } if !lost => Step::Send {
                        holds: remote,
                        keep: None,
                    },
                    Released::Partial if !lost => Step::Send {
                        holds: 1,
                        keep: Some(wd.lease()),
                    },
                    _ => Step::Lost {
                        sweep: self.sweepable(),
                    },
                }
            }
            GuardKind::Lease { .. } => {
                inner.fixed.remove(&self.hold.name, &self.hold.field);
                Step::Send {
                    holds: 1,
                    keep: wd
                        .is_registered(&self.hold.name, &self.hold.field)
                        .then(|| wd.lease()),
                }
            }
        }
    }

    /// Claims the field for a sweep if nothing else of this client uses it now.
    fn sweepable(&self) -> Option<InFlightGuard> {
        let inner = &self.lock.client.inner;
        let (name, field) = (&self.hold.name, &self.hold.field);
        let unused = !inner.watchdog.is_registered(name, field)
            && !inner.fixed.holds(name, field)
            && !inner.inflight.busy(name, field);
        unused.then(|| inner.inflight.begin(name, field))
    }
}

/// Deletes whatever is left under the field of a lost hold (see [`Step::Lost`]).
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
        if state.lock.client.inner.closed.is_set() {
            return;
        }
        let (holds, keep) = match state.begin_release() {
            Step::Send { holds, keep } => (holds, keep),
            Step::Lost {
                sweep: Some(in_flight),
            } => {
                let inner = state.lock.client.inner.clone();
                inner.clone().spawner().errand(async move {
                    let outcome = sweep_lost(inner, state.hold, in_flight).await;
                    tracing::debug!(?outcome, "swept the field of a lost hold");
                });
                return;
            }
            Step::Local | Step::Lost { sweep: None } => return,
        };
        let inner = state.lock.client.inner.clone();
        inner.clone().spawner().errand(async move {
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
