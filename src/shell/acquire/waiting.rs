//! One waiting acquisition from step to step: an attempt and what its answer means, a
//! sleep and what woke it (a release heard, a hand-over, the bound), and its place in
//! the client's hand-over queue.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::line::InLine;
use crate::error::{Error, Result};
use crate::identity::Kind;
use crate::identity::OwnerId;
use crate::policy::waiter::{self, Answer, Pauses, Woken};
use crate::shell::attempt::Tried;
use crate::shell::held::Held;
use crate::shell::release::release_detached;
use crate::shell::target::Target;
use crate::state::{Grant, Left, Waiter, Woke};
use crate::stats::Event;
use crate::wire::pubsub::Subscription;
use crate::wire::raw;

/// How long an acquisition may wait.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    /// One attempt.
    No,
    /// Until this instant (`None`: forever).
    Until(Option<Instant>),
}

/// Where a waiting acquisition stands: the core's state (`policy::waiter`), holding the
/// guard once it has the lock.
pub(super) type Step = waiter::Step<Held, Error>;

/// One waiting acquisition, from before its first attempt to its end: what it keeps from
/// one step to the next, and what it holds of its client while it waits (its part in
/// the lock's line in Redis, its place in the hand-over queue, its subscription). It
/// ends in one place, its `Drop`, however the call ends: with the lock, out of time, by
/// an error, or cancelled.
pub(super) struct Waiting<'a> {
    pub(super) target: &'a Target,
    pub(super) owner: OwnerId,
    pub(super) field: Arc<str>,
    pub(super) lease: Option<Duration>,
    pub(super) wait: Wait,
    pub(super) deadline: Option<Instant>,
    pub(super) started: Instant,
    /// Joined once answered busy, or before the first attempt where the channel is
    /// heard already.
    sub: Option<Subscription>,
    /// Taken once the call waits (its subscription ready): asleep, the task may be
    /// handed the lock by an unlock of its client.
    queued: Option<Waiter>,
    /// Start of the current run of transient errors, if in one.
    pub(super) failing_since: Option<Instant>,
    /// A failed unlock may have handed this task the lock: the next attempt adopts
    /// such a hold instead of taking a second one. Over once an attempt is answered.
    pub(super) adopt: bool,
    pub(super) line: InLine<'a>,
}

impl<'a> Waiting<'a> {
    pub(super) fn new(
        target: &'a Target,
        owner: OwnerId,
        field: Arc<str>,
        lease: Option<Duration>,
        wait: Wait,
    ) -> Waiting<'a> {
        let deadline = match wait {
            Wait::No => None,
            Wait::Until(d) => d,
        };
        Waiting {
            target,
            owner,
            line: InLine::new(target, field.clone()),
            field,
            lease,
            wait,
            deadline,
            started: Instant::now(),
            sub: None,
            queued: None,
            failing_since: None,
            adopt: false,
        }
    }

    /// Joins the lock's channel now, before the first attempt (the caller saw this
    /// client hear it already); `true` when that subscription is confirmed (the channel may have
    /// stopped lingering in between: it is then as if joined after the attempt).
    pub(super) fn subscribe_early(&mut self) -> bool {
        self.sub = Some(self.target.subscription(&self.field).early());
        self.sub.as_ref().is_some_and(Subscription::confirmed)
    }

    /// The subscription, joined now if not yet.
    pub(super) fn sub(&mut self) -> &mut Subscription {
        let (target, field) = (self.target, &self.field);
        self.sub.get_or_insert_with(|| target.subscription(field))
    }

    /// Takes its place in the client's hand-over queue, if it has none yet: the queue is
    /// in the order of these calls.
    pub(super) fn take_place(&mut self) {
        self.asleep();
    }

    /// What a sleep waits on: the subscription and the place in the client's hand-over
    /// queue, each taken now if not yet.
    fn asleep(&mut self) -> (&mut Subscription, &mut Waiter) {
        let (target, field) = (self.target, &self.field);
        let inner = target.inner();
        let lease = self.lease.unwrap_or(inner.config.watchdog_timeout);
        let sub = self.sub.get_or_insert_with(|| target.subscription(field));
        let queued = self
            .queued
            .get_or_insert_with(|| inner.core.waiter(&target.name, field, lease, target.fenced));
        (sub, queued)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // A wake-up the subscription has not used passes to another waiter of the name
        // (`Subscription::wake_passed_over`). The three parts are independent: the order
        // is the one the fields dropped in before this `Drop`.
        drop(self.sub.take());
        // A grant that arrived after the waiter stopped looking is still a hold in Redis.
        if let Some(Left::Granted(g)) = self.queued.as_ref().map(Waiter::leave) {
            let (target, inner) = (self.target, self.target.inner());
            tracing::debug!(lock = %target.name, token = g.token, "releasing a hand-over nobody took");
            release_detached(inner.clone(), target.hold(&self.field));
        }
        // A call that ends with the lock, or gives up and already left, sends nothing.
        self.line.leave_detached();
    }
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

/// How the first attempt of a call that may wait came out, where it goes on.
pub(super) enum First {
    Held(Held),
    /// Busy; the holder's lease left, if Redis said.
    Busy(Option<Duration>),
}

impl Waiting<'_> {
    /// The call's first attempt. A single try that gets no answer in time, or a grant
    /// that came too late to use, ends the call with `Timeout`; so does a wait whose
    /// deadline came before any answer, which is not "busy". `started`: when the call
    /// began.
    pub(super) async fn first_attempt(&mut self, started: Instant) -> Result<First> {
        let target = self.target;
        let counted = self.line.counted(true);
        let tried = target
            .attempt_within(
                self.owner,
                &self.field,
                self.lease,
                false,
                self.wait,
                counted,
            )
            .await?;
        let single = matches!(self.wait, Wait::No);
        let ttl = match tried {
            Some(Tried::Held(guard)) => {
                self.line.granted_by_redis = true;
                return Ok(First::Held(guard));
            }
            Some(Tried::Busy(ttl)) => ttl,
            Some(Tried::TurnBusy(ttl)) => Some(ttl),
            Some(Tried::Late(took)) if single => {
                return Err(Error::Timeout {
                    op: "try_lock (granted after its lease ran out)",
                    after: took,
                })
            }
            // Given back already; try again as soon as the holder's lease allows.
            Some(Tried::Late(_)) => Some(Duration::ZERO),
            None if single => {
                return Err(Error::Timeout {
                    op: "try_lock",
                    after: target.inner().config.response_timeout,
                })
            }
            // (Once an attempt was answered busy, running out of time is `Ok(None)`.)
            None => {
                return Err(Error::Timeout {
                    op: "try_lock_for: its wait ended first",
                    after: started.elapsed(),
                })
            }
        };
        Ok(First::Busy(ttl))
    }

    pub(super) async fn attempt(&mut self) -> Step {
        let target = self.target;
        // This client just ended a run of hand-overs on the name, or yields its turn:
        // the others go first, its woken waiters included (a holder of the field never
        // defers).
        let inner = target.inner();
        if let Some(until) = inner.held_back(&target.name, &target.channel) {
            let holds = inner.core.holds(&target.name, &self.field);
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
        let answer = match tried {
            Ok(None) => {
                tracing::debug!(waited = ?self.started.elapsed(), "wait ran out during an attempt");
                Answer::NoAnswer
            }
            Ok(Some(Tried::Held(guard))) => {
                self.line.granted_by_redis = true;
                self.sub().wake_used();
                tracing::debug!(waited = ?self.started.elapsed(), "acquired after waiting");
                Answer::Held(guard)
            }
            Ok(Some(answered)) => {
                match answered {
                    // Free for another client's turn: a wake-up that led here has not
                    // been used, and goes to another waiter of the name if this one
                    // leaves before it tries again (see `Subscription::wake_passed_over`).
                    Tried::TurnBusy(_) => self.sub().wake_passed_over(),
                    _ => self.sub().wake_used(),
                }
                self.adopt = false;
                self.failing_since = None;
                match answered {
                    Tried::Busy(ttl) => {
                        self.line.busy();
                        Answer::Busy(ttl)
                    }
                    Tried::TurnBusy(ttl) => {
                        self.line.busy();
                        Answer::Busy(Some(ttl))
                    }
                    _ => Answer::Late,
                }
            }
            Err(e) if e.is_transient() => {
                // A waiter rides out a failover or reconnect: the lock it waits for is
                // still there, on whichever node serves it next.
                let since = *self.failing_since.get_or_insert_with(Instant::now);
                tracing::debug!(error = %e, "transient error while waiting");
                Answer::Transient {
                    error: e,
                    failing_for: since.elapsed(),
                }
            }
            Err(e) => Answer::Failed(e),
        };
        waiter::after_attempt(answer, target.inner().config.retry_window)
    }

    /// Woken by the end of another client's turn: that client may have used it and
    /// still hold the lock, and its release will be heard. One `PTTL` then stands in for
    /// an acquire, which every waiting client would otherwise send at each turn held
    /// longer than the window (`docs/protocol.md` 2.6).
    pub(super) async fn look(&mut self) -> Step {
        let target = self.target;
        let pttl = raw::lock_pttl(&target.inner().conn, &target.name)
            .await
            .ok();
        let step = waiter::after_look(pttl);
        if matches!(step, Step::Sleep { .. }) {
            self.sub().wake_used();
        }
        step
    }

    /// Sleeps at most `ttl` (cut by the deadline); `lease_known`: `ttl` is the holder's
    /// lease left, just read from Redis.
    pub(super) async fn sleep(&mut self, ttl: Option<Duration>, lease_known: bool) -> Step {
        let target = self.target;
        let lease_ends = ttl.filter(|_| lease_known).map(|t| Instant::now() + t);
        let Some(bound) = target.bound(ttl, self.deadline) else {
            tracing::debug!(waited = ?self.started.elapsed(), "wait ran out");
            return Step::Done(Ok(None));
        };
        // Not before earlier requests of the field are settled: a release of an earlier
        // call's unused grant (see `Waiting`'s drop) would take a hold handed to this
        // task meanwhile. Still unsettled at the bound, the next attempt waits for them.
        let core = &target.inner().core;
        let mut bound = bound;
        if core.in_flight(&target.name, &self.field) {
            let began = Instant::now();
            Box::pin(core.settled(&target.name, &self.field, bound)).await;
            if core.in_flight(&target.name, &self.field) {
                return Step::Attempt { adopt: false };
            }
            bound = bound.saturating_sub(began.elapsed());
        }
        // Asleep, this task may be handed the lock by an unlock of this client.
        let deadline = self.deadline;
        let (sub, queued) = self.asleep();
        queued.park(lease_ends);
        tokio::select! {
            _ = sub.woken(bound) => {}
            _ = queued.picked() => {}
            _ = target.inner().closed.wait() => {}
        }
        let woke = match queued.unpark() {
            Woke::Offered => {
                // The unlock's reply settles it within the unlock's own timeouts, as long
                // as its future is polled; past those, this task stops waiting.
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                let (limit, ends) = waiter::offer_limit(left, target.inner().offer_bound());
                match tokio::time::timeout(limit, queued.outcome()).await {
                    Ok(w) => w,
                    // Dropping the waiter leaves the offer to the unlocker, which releases
                    // the hold if it was granted.
                    Err(_) if ends => return Step::Done(Ok(None)),
                    // Only when the unlock's future is not being polled: this task
                    // acquires on its own (see `Waiter::abandon_offer`), adopting the
                    // grant if it is there by now.
                    Err(_) => match queued.abandon_offer() {
                        Woke::Free => Woke::Unsure,
                        w => w,
                    },
                }
            }
            w => w,
        };
        // Dropped once the grant is registered or given back, at the end of this step.
        let _taking = queued.take_mark();
        let woken = self.woken(woke);
        let pauses = Pauses {
            backstop: target.inner().config.watchdog_timeout,
            turn_window: target.inner().config.turn_window,
        };
        match waiter::after_wake(woken, pauses) {
            waiter::Step::GiveBack => {
                release_detached(target.inner().clone(), target.hold(&self.field));
                Step::Attempt { adopt: false }
            }
            step => step.map_held(|grant| {
                tracing::debug!(waited = ?self.started.elapsed(), token = grant.token, "lock handed over");
                target.held(
                    target.hold(&self.field),
                    self.owner,
                    self.lease,
                    grant.sent,
                    grant.token,
                )
            }),
        }
    }

    /// What woke the sleep, in the core's terms.
    fn woken(&mut self, woke: Woke) -> Woken<Grant, Error> {
        let target = self.target;
        let inner = target.inner();
        let grant = match woke {
            Woke::Granted(g) => g,
            Woke::Unsure => return Woken::Unsure,
            Woke::Free => {
                return Woken::Free {
                    lapse: self.sub().woken_by_lapse(),
                }
            }
            Woke::Offered => return Woken::Free { lapse: false },
            Woke::Passed => {
                return Woken::Passed {
                    covered: inner.pubsub.turn_covered(&target.channel),
                }
            }
        };
        self.sub().wake_used();
        if grant.unacked {
            // Given back like an acquisition of this task that no replica acknowledged;
            // the next attempt, synced, waits for that release (in flight for the
            // field) and meets `SyncFailure` as its own would. This task undoes it, not
            // the unlocker: only it knows whether it took the hold by an attempt of its
            // own meanwhile, which an undo from outside would delete. Not an adopting
            // retry either: another call of the same owner may hold the field by then.
            // Should the give-back fail, the hold it leaves ends with its lease.
            tracing::warn!(lock = %target.name, "no replica acknowledged a hand-over; given back");
        } else {
            inner.stats.count(Event::HandedOver(grant.sent.elapsed()));
        }
        let granted = self.lease.unwrap_or(inner.config.watchdog_timeout);
        let late = grant.sent + granted <= Instant::now();
        if late && !grant.unacked {
            // As for an acquire answered too late: a guard would be lost on arrival.
            tracing::debug!(
                token = grant.token,
                "hand-over arrived after its lease ran out"
            );
        }
        // The client shut down after the grant was handed over: shutdown released the
        // field whole, this grant with it.
        let closed = inner.closed.is_set().then_some(Error::Closed);
        Woken::Handed {
            unacked: grant.unacked,
            late,
            closed,
            hold: grant,
        }
    }
}
