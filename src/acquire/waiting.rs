//! One waiting acquisition from step to step: an attempt and what its answer means, a
//! sleep and what woke it (a release heard, a hand-over, the bound), and its place in
//! the client's hand-over queue.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::attempt::Tried;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::handover::{Left, Waiter};
use crate::identity::OwnerId;
use crate::line::InLine;
use crate::pubsub::Subscription;
use crate::queue::Woke;
use crate::raw;
use crate::release::release_detached;
use crate::services::ClientInner;
use crate::stats::Event;
use crate::target::{Hold, Kind, Target};

/// How long an acquisition may wait.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    /// One attempt.
    No,
    /// Until this instant (`None`: forever).
    Until(Option<Instant>),
}

/// Where a waiting acquisition stands.
pub(super) enum Step {
    /// Ask Redis.
    Attempt,
    /// Sleep until woken, offered the lock, or `ttl` (capped by the deadline) has
    /// passed. `lease_ends`: when the holder's lease ends, as the last busy reply said.
    Sleep {
        ttl: Option<Duration>,
        lease_ends: Option<Instant>,
    },
    /// Finished: the guard, out of time (`None`), or an error.
    Done(Result<Option<LockGuard>>),
}

/// What a waiting acquisition keeps from one step to the next.
pub(super) struct Waiting<'a> {
    pub(super) target: &'a Target,
    pub(super) owner: OwnerId,
    pub(super) field: Arc<str>,
    pub(super) lease: Option<Duration>,
    pub(super) wait: Wait,
    pub(super) deadline: Option<Instant>,
    pub(super) started: Instant,
    pub(super) sub: Subscription,
    pub(super) queued: Queued,
    /// Start of the current run of transient errors, if in one.
    pub(super) failing_since: Option<Instant>,
    /// A failed unlock may have handed this task the lock: the next attempt adopts
    /// such a hold instead of taking a second one. Over once an attempt is answered.
    pub(super) adopt: bool,
    pub(super) line: InLine<'a>,
}

impl Target {
    /// Joins the channel on which this lock's releases are heard (a fair lock's waiter:
    /// its own, on which it hears that it is first in line).
    pub(super) fn subscription(&self, field: &str) -> Subscription {
        let pubsub = &self.inner().pubsub;
        match self.kind {
            Kind::Fair => {
                let channel = raw::waiter_channel(&self.name, field).into();
                pubsub.subscribe(&channel, false, &self.name)
            }
            Kind::Plain => {
                let turns = !self.inner().config.turn_window.is_zero();
                pubsub.subscribe(&self.channel, turns, &self.name)
            }
            _ => pubsub.subscribe(&self.channel, false, &self.name),
        }
    }
}

impl Waiting<'_> {
    pub(super) async fn attempt(&mut self) -> Step {
        let target = self.target;
        // This client just ended a run of hand-overs on the name: the others go first,
        // its woken waiters included (a holder of the field never defers).
        let inner = target.inner();
        if let Some(until) = inner.handover.held_back(&target.name) {
            let holds = inner.table.holds(&target.name, &self.field);
            if !holds && super::worth_holding_back(until, self.deadline) {
                tokio::time::sleep_until(until).await;
            }
        }
        let tried = target
            .attempt_within(
                self.owner,
                &self.field,
                self.lease,
                self.adopt,
                self.wait,
                self.line.counted(false),
            )
            .await;
        match tried {
            Ok(None) => {
                tracing::debug!(waited = ?self.started.elapsed(), "wait ran out during an attempt");
                Step::Done(Ok(None))
            }
            Ok(Some(Tried::Held(guard))) => {
                self.line.granted_by_redis = true;
                self.sub.wake_used();
                tracing::debug!(waited = ?self.started.elapsed(), "acquired after waiting");
                Step::Done(Ok(Some(guard)))
            }
            Ok(Some(answered)) => {
                self.sub.wake_used();
                self.adopt = false;
                self.failing_since = None;
                match answered {
                    Tried::Busy(ttl) => {
                        self.line.busy();
                        Step::Sleep {
                            ttl,
                            lease_ends: ttl.map(|t| Instant::now() + t),
                        }
                    }
                    // Given back already; try again as soon as the holder's lease allows.
                    _ => Step::Sleep {
                        ttl: Some(Duration::ZERO),
                        lease_ends: None,
                    },
                }
            }
            Err(e) if e.is_transient() => {
                // A waiter rides out a failover or reconnect: the lock it waits for is
                // still there, on whichever node serves it next.
                let since = *self.failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= target.inner().config.retry_window {
                    return Step::Done(Err(e));
                }
                tracing::debug!(error = %e, "transient error while waiting; retrying");
                let pause = Duration::from_millis(50)
                    .max(since.elapsed() / 4)
                    .min(Duration::from_millis(500));
                Step::Sleep {
                    ttl: Some(pause),
                    lease_ends: None,
                }
            }
            Err(e) => Step::Done(Err(e)),
        }
    }

    /// Woken by the end of another client's turn: that client may have used it and
    /// still hold the lock, and its release will be heard. One `PTTL` then stands in for
    /// an acquire, which every waiting client would otherwise send at each turn held
    /// longer than the window (`docs/protocol.md` 2.6).
    async fn look(&mut self) -> Step {
        let target = self.target;
        match raw::lock_pttl(&target.inner().conn, &target.name).await {
            Ok(-2) | Err(_) => Step::Attempt,
            Ok(ms) => {
                self.sub.wake_used();
                let ttl = u64::try_from(ms).ok().map(Duration::from_millis);
                Step::Sleep {
                    ttl,
                    lease_ends: ttl.map(|t| Instant::now() + t),
                }
            }
        }
    }

    pub(super) async fn sleep(
        &mut self,
        ttl: Option<Duration>,
        lease_ends: Option<Instant>,
    ) -> Step {
        let target = self.target;
        let Some(bound) = target.bound(ttl, self.deadline) else {
            tracing::debug!(waited = ?self.started.elapsed(), "wait ran out");
            return Step::Done(Ok(None));
        };
        // Not before earlier requests of the field are settled: a release of an earlier
        // call's unused grant (see `Queued`'s drop) would take a hold handed to this
        // task meanwhile. Still unsettled at the bound, the next attempt waits for them.
        let table = &target.inner().table;
        let mut bound = bound;
        if table.in_flight(&target.name, &self.field) {
            let began = Instant::now();
            Box::pin(table.settled(&target.name, &self.field, bound)).await;
            if table.in_flight(&target.name, &self.field) {
                return Step::Attempt;
            }
            bound = bound.saturating_sub(began.elapsed());
        }
        // Asleep, this task may be handed the lock by an unlock of this client.
        self.queued.waiter.park(lease_ends);
        tokio::select! {
            _ = self.sub.woken(bound) => {}
            _ = self.queued.waiter.picked() => {}
            _ = target.inner().closed.wait() => {}
        }
        let woke = match self.queued.waiter.unpark() {
            Woke::Offered => {
                // The unlock's reply settles it within the unlock's own timeouts, as long
                // as its future is polled; past those, this task stops waiting.
                let bound = target.inner().offer_bound();
                let left = self
                    .deadline
                    .map(|d| d.saturating_duration_since(Instant::now()));
                let limit = left.map_or(bound, |l| l.min(bound));
                match tokio::time::timeout(limit, self.queued.waiter.outcome()).await {
                    Ok(w) => w,
                    // Dropping `queued` leaves the offer to the unlocker, which releases
                    // the hold if it was granted.
                    Err(_) if left.is_some_and(|l| l <= bound) => return Step::Done(Ok(None)),
                    // Only when the unlock's future is not being polled: this task
                    // acquires on its own (see `Waiter::abandon_offer`), adopting the
                    // grant if it is there by now.
                    Err(_) => match self.queued.waiter.abandon_offer() {
                        Woke::Free => Woke::Unsure,
                        w => w,
                    },
                }
            }
            w => w,
        };
        // Dropped once the grant is registered or given back, at the end of this step.
        let _taking = self.queued.waiter.take_mark();
        let grant = match woke {
            Woke::Granted(g) => g,
            Woke::Unsure => {
                self.adopt = true;
                return Step::Attempt;
            }
            Woke::Free if self.sub.woken_by_lapse() => return self.look().await,
            Woke::Free | Woke::Offered => return Step::Attempt,
            // Another client's turn came first; this client's own turn, or a hand-over
            // from it, wakes this task. Where the client heard that turn announced, its
            // lapse wakes the task too, and the bound is only a backstop; otherwise the
            // task asks again once the turn is over, as after a busy answer for a turn.
            Woke::Passed => {
                let inner = target.inner();
                let covered = inner.pubsub.turn_covered(&target.channel);
                return Step::Sleep {
                    ttl: Some(if covered {
                        inner.config.watchdog_timeout
                    } else {
                        inner.config.turn_window
                    }),
                    lease_ends: None,
                };
            }
        };
        self.sub.wake_used();
        if grant.unacked {
            // Given back like an acquisition of this task that no replica acknowledged;
            // the next attempt, synced, waits for that release (in flight for the
            // field) and meets `SyncFailure` as its own would. This task undoes it, not
            // the unlocker: only it knows whether it took the hold by an attempt of its
            // own meanwhile, which an undo from outside would delete. Not an adopting
            // retry either: another call of the same owner may hold the field by then.
            // Should the give-back fail, the hold it leaves ends with its lease.
            tracing::warn!(lock = %target.name, "no replica acknowledged a hand-over; given back");
            release_detached(target.inner().clone(), target.hold(&self.field));
            return Step::Attempt;
        }
        target
            .inner()
            .stats
            .count(Event::HandedOver(grant.sent.elapsed()));
        let granted = self.lease.unwrap_or(target.inner().config.watchdog_timeout);
        if grant.sent + granted <= Instant::now() {
            // As for an acquire answered too late: a guard would be lost on arrival. The
            // hold is given back and the wait goes on.
            tracing::debug!(
                token = grant.token,
                "hand-over arrived after its lease ran out"
            );
            release_detached(target.inner().clone(), target.hold(&self.field));
            return Step::Attempt;
        }
        if target.inner().closed.is_set() {
            // The client shut down after the grant was handed over: shutdown released
            // the field whole, this grant with it.
            return Step::Done(Err(Error::Closed));
        }
        tracing::debug!(waited = ?self.started.elapsed(), token = grant.token, "lock handed over");
        Step::Done(Ok(Some(target.held(
            target.hold(&self.field),
            self.owner,
            self.lease,
            grant.sent,
            grant.token,
        ))))
    }
}

/// A waiter's place in the hand-over queue, for as long as it waits.
pub(super) struct Queued {
    pub(super) waiter: Waiter,
    pub(super) inner: Arc<ClientInner>,
    pub(super) hold: Hold,
}

impl Drop for Queued {
    fn drop(&mut self) {
        // A grant that arrived after the waiter stopped looking is still a hold in Redis.
        if let Left::Granted(g) = self.waiter.leave() {
            tracing::debug!(lock = %self.hold.name, token = g.token, "releasing a hand-over nobody took");
            release_detached(self.inner.clone(), self.hold.clone());
        }
    }
}
