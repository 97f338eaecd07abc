//! One waiting acquisition from step to step: an attempt and what its answer means, a
//! sleep and what woke it (a release heard, a hand-over, the bound), and its place in
//! the client's hand-over queue.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::attempt::{Place, Tried};
use crate::error::Result;
use crate::guard::LockGuard;
use crate::handover::{Left, Waiter};
use crate::identity::OwnerId;
use crate::line::{Counted, InLine};
use crate::pubsub::Subscription;
use crate::queue::Woke;
use crate::raw;
use crate::release::{release_detached, release_named};
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
                pubsub.subscribe(&channel, None, &self.name)
            }
            Kind::Plain if !self.inner().config.turn_window.is_zero() => {
                let turns = raw::turns_channel(&self.name).into();
                pubsub.subscribe(&self.channel, Some(&turns), &self.name)
            }
            _ => pubsub.subscribe(&self.channel, None, &self.name),
        }
    }
}

impl Waiting<'_> {
    pub(super) async fn attempt(&mut self) -> Step {
        let target = self.target;
        let place = self.queued.before_attempt(self.line.counted(false));
        let tried = target
            .attempt_within(
                self.owner,
                &self.field,
                self.lease,
                self.adopt,
                self.wait,
                place,
            )
            .await;
        self.queued.after_attempt(&tried);
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
        if grant.direct {
            // The unlock that granted it took this client's place in line too (a grant
            // given back above leaves the wait going, and its next busy reply joins again).
            self.line.granted_by_redis = true;
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
    /// Another client's unlock may grant this waiter the lock directly, once an attempt
    /// named it (`docs/protocol.md` 2.7).
    pub(super) direct: bool,
    /// An attempt that may have named it was sent.
    pub(super) named: bool,
    /// The acquisition ended holding the lock.
    pub(super) held: bool,
}

impl Queued {
    /// The next attempt's place (see [`Place`]): with a number that names this waiter
    /// if the client knows of no hold of its field (a hold of its own could not be told
    /// from a grant then), counted as named from its send.
    pub(super) fn before_attempt(&mut self, in_line: Counted) -> Place {
        // Named by an unlock of its own client that gave way: a grant to it is adopted
        // as one to an attempt of its own would be.
        self.named |= self.waiter.named_by_unlock();
        let named = self.named;
        let designate = (self.direct && !self.inner.table.holds(&self.hold.name, &self.hold.field))
            .then(|| self.waiter.naming());
        self.named |= designate.is_some();
        Place {
            in_line,
            designate,
            named,
        }
    }

    /// The attempt was answered: holding, it adopted any direct grant made to it,
    /// which is then not another hold. It failed: a grant it may have adopted and given
    /// back is not taken either.
    pub(super) fn after_attempt(&mut self, tried: &Result<Option<Tried>>) {
        if !self.direct {
            return;
        }
        match tried {
            Ok(Some(Tried::Held(_))) => {
                self.waiter.took();
                self.held = true;
            }
            Err(_) => self.waiter.unname(),
            _ => {}
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let (inner, hold) = (self.inner.clone(), self.hold.clone());
        let holds = inner.table.holds(&hold.name, &hold.field);
        // A grant that arrived after the waiter stopped looking is still a hold in Redis.
        // Any waiter that may be named (by an attempt of its own, or by the very unlock
        // now offering it the lock, which marks it only after picking it) leaves the
        // settling to an offer in flight.
        let left = if self.direct && !self.held && !holds {
            let in_flight = inner.table.begin(&hold.name, &hold.field);
            self.waiter.leave_named(Box::new(in_flight))
        } else {
            self.waiter.leave()
        };
        // Named by an unlock of its own client: from that unlock's send on, which came
        // before its reply settled the offer, so before a leave that found it settled.
        self.named |= self.waiter.named_by_unlock();
        match left {
            // A direct grant heard after the call took the lock is the hold it took.
            Left::Granted(g) if g.direct && self.held => {}
            // The unlock offering it the lock settles the rest (see `leave_named`).
            Left::Offered if self.direct && !holds => {}
            // The field holds the lock for another guard of this client: no other
            // client's unlock can grant it meanwhile, and a release here would take that
            // guard's hold. Only the naming is left to withdraw.
            _ if self.named && !self.held && holds => {
                // In flight for the field, so that it cannot withdraw a later naming.
                let in_flight = inner.table.begin(&hold.name, &hold.field);
                inner.clone().spawner().errand(async move {
                    let _in_flight = in_flight;
                    let r = raw::withdraw_naming(&inner.conn, &hold.name, &hold.field).await;
                    tracing::debug!(lock = %hold.name, outcome = ?r, "withdrew a naming");
                });
            }
            // Named, it may have been granted the lock with its message still on the way:
            // the release withdraws the naming and gives back such a grant.
            _ if self.named && !self.held => release_named(inner, hold),
            Left::Granted(g) => {
                tracing::debug!(lock = %hold.name, token = g.token, "releasing a hand-over nobody took");
                release_detached(inner, hold);
            }
            _ => {}
        }
    }
}
