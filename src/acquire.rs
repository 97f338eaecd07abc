//! The waiting loop of an acquisition: attempt, subscribe, sleep until woken, handed the
//! lock, or out of time, and attempt again.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::attempt::Tried;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::handover::{Waiter, Woke};
use crate::identity::OwnerId;
use crate::release::release_detached;
use crate::services::ClientInner;
use crate::target::{check_lease, Hold, Target};

/// How long an acquisition may wait.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    /// One attempt.
    No,
    /// Until this instant (`None`: forever).
    Until(Option<Instant>),
}

impl Target {
    pub(crate) async fn acquire_unbounded(&self, lease: Option<Duration>) -> Result<LockGuard> {
        // A wait without a deadline only ends with the lock or an error; the loop states
        // that without an internal error nobody could act on.
        loop {
            if let Some(guard) = self.acquire(lease, Wait::Until(None)).await? {
                return Ok(guard);
            }
        }
    }

    pub(crate) async fn acquire(
        &self,
        lease: Option<Duration>,
        wait: Wait,
    ) -> Result<Option<LockGuard>> {
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
