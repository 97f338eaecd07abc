//! The tasks of one client asleep waiting for one lock name, in the order they first
//! waited, and the state of each one's ticket. Plain data: the per-client table keeps one
//! [`Queue`] per name, and the hand-over decides who is offered the lock.
//!
//! A ticket is settled exactly once, under its own mutex, by whichever side comes second:
//! the unlock delivering a grant, or the waiter leaving (cancelled or out of time).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

pub(crate) use crate::policy::run::{Run, Terms};

/// Where one waiter's ticket stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Not offered; the waiter may send its own acquires.
    Free,
    /// An unlock carrying this waiter as next holder is in flight.
    Offered,
    /// The unlock handed the lock over: `token`, lease counted from `sent`.
    Granted(Grant),
    /// The unlock failed after it may have run: the waiter may hold the lock without
    /// knowing it, so its next acquire asks Redis to adopt such a hold (the retry branch
    /// of `lua/acquire.lua`) instead of taking a second one.
    Unsure,
    /// The unlock gave way to another client's turn instead of handing over: the waiter
    /// sleeps on without an attempt of its own.
    Passed,
    /// The waiter left; a grant arriving now is the unlocker's to release.
    Gone,
    /// The waiter stopped waiting for an offer that was not settled in time (see
    /// [`Waiter::abandon_offer`]); a grant arriving now is left to expire by its lease.
    Abandoned,
}

/// A hold written by the unlock script for a waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) token: u64,
    /// When the unlock that granted it was sent; the lease runs from no earlier.
    pub(crate) sent: Instant,
    /// Replica sync is on and no replica acknowledged the hand-over: the waiter gives
    /// it back, as an acquisition of its own would be rolled back, and acquires anew.
    pub(crate) unacked: bool,
}

/// One sleeping waiter, as the unlocking side sees it.
pub(crate) struct Ticket {
    /// The waiter's holder field, written into the hash on hand-over.
    pub(crate) field: Arc<str>,
    /// The lease the waiter asked for (the watchdog timeout for watchdog locks).
    pub(crate) lease: Duration,
    /// The waiter's lock is fenced: its grant must draw a token.
    pub(crate) fenced: bool,
    pub(crate) seq: u64,
    pub(crate) state: Mutex<State>,
    pub(crate) changed: Notify,
    /// The unlock's mark that keeps the field in flight, handed over with a grant and
    /// kept until the waiter has taken it (see [`Ticket::deliver`]). Opaque here: the
    /// table's guard, dropped to end the mark.
    pub(crate) mark: Mutex<Option<Box<dyn Send>>>,
}

impl Ticket {
    /// Gives the hold to the waiter. `false` if the waiter has left: the caller then
    /// owns the hold and must release it. `mark` keeps the field in flight until the
    /// waiter has taken the hold (registered it, or given it back): a call of the same
    /// field meanwhile (a twin future of the task) would otherwise be sent as knowing of
    /// no hold, and adopt this one as its own, two guards on one hold.
    pub(crate) fn deliver(&self, grant: Grant, mark: Box<dyn Send>) -> bool {
        let mut s = self.state.lock();
        let delivered = match *s {
            State::Offered => {
                *s = State::Granted(grant);
                *self.mark.lock() = Some(mark);
                true
            }
            // Too late to tell whether a release by field would hit this grant or a
            // later hold of the same task: the grant runs out by its lease instead.
            State::Abandoned => true,
            _ => false,
        };
        drop(s);
        self.changed.notify_one();
        delivered
    }

    /// The unlock did not hand over (holds remained, or nothing was held): the waiter
    /// goes back to acquiring on its own.
    pub(crate) fn revert(&self) {
        self.settle(State::Free)
    }

    /// The unlock gave way to another client's turn (see [`State::Passed`]).
    pub(crate) fn pass(&self) {
        self.settle(State::Passed)
    }

    /// The unlock failed, and may have handed over before it did (see `State::Unsure`).
    /// A waiter that has left never learns of such a hand-over: it ends with its lease.
    pub(crate) fn unsure(&self) {
        self.settle(State::Unsure)
    }

    /// Settles an offer still in flight (one whose waiter left stays left).
    fn settle(&self, to: State) {
        let mut s = self.state.lock();
        if *s == State::Offered {
            *s = to;
        }
        drop(s);
        self.changed.notify_one();
    }
}

#[derive(Default)]
pub(crate) struct Queue {
    /// Sleeping, not offered, by first-wait order.
    pub(crate) sleeping: BTreeMap<u64, Arc<Ticket>>,
    /// This client's run of hand-overs on the name (times by [`since_origin`]).
    pub(crate) run: Run,
    /// After this client ended a streak with a published release: until then its own
    /// new acquires of the name hold back, so that the waiters the message wakes, here
    /// and in other clients, race on equal terms with the task that just released.
    pub(crate) yield_until: Option<Instant>,
    /// When the current holder's lease ends, as the latest busy reply to a waiter here
    /// said. A task that finds others asleep here waits behind them until then at most,
    /// without asking Redis what they already know.
    pub(crate) holder_until: Option<Instant>,
}

impl Queue {
    /// Nothing left worth keeping: nobody asleep, no run of hand-overs still counting,
    /// no hold-back in force.
    /// `now` is read only when a time decides it (reading the clock is a noticeable
    /// part of a lock call, and most entries have no hold-back or run to time).
    pub(crate) fn idle(&self, now: impl Fn() -> Instant, window: Duration) -> bool {
        self.sleeping.is_empty()
            && self.yield_until.is_none_or(|u| u <= now())
            && (self.run.streak() == 0 || self.run.idle(since_origin(now()), window))
    }
}

/// The clock's origin for [`Run`]'s times: the first time anyone asked.
static ORIGIN: once_cell::sync::Lazy<Instant> = once_cell::sync::Lazy::new(Instant::now);

/// `at` as the policy's time: the time since [`ORIGIN`].
pub(super) fn since_origin(at: Instant) -> Duration {
    at.saturating_duration_since(*ORIGIN)
}

/// What an unlock should do with the lock on a full release.
pub(crate) enum Offer {
    /// Hand it to this waiter, on these terms.
    To(Arc<Ticket>, Terms),
    /// Publish: this client has nobody waiting.
    Publish,
    /// Publish, ending a streak of hand-overs while this client still has waiters, and
    /// leave the lock to others for at least `gap` (a share of the streak when it
    /// ended whoever waits, for waiters nobody can see; see
    /// [`RUN_GAP_SHARE`](crate::policy::run::RUN_GAP_SHARE)).
    EndStreak { gap: Duration },
}

/// What a waiter finds when it stops sleeping.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Woke {
    /// Not offered: try to acquire.
    Free,
    /// An unlock is handing the lock over; wait for [`Waiter::outcome`].
    Offered,
    /// The lock was handed over.
    Granted(Grant),
    /// The unlock failed after it may have handed over: acquire, adopting a hold that
    /// may already be there (see `State::Unsure`).
    Unsure,
    /// The unlock gave way to another client's turn: sleep on (see `State::Passed`).
    Passed,
}
