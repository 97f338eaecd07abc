//! The tasks of one client asleep waiting for one lock name, in the order they first
//! waited, and the state of each one's ticket. Plain data: the per-client table keeps one
//! [`Queue`] per name, and the hand-over decides who is offered the lock.
//!
//! A ticket is settled exactly once, under its own mutex, by whichever side comes second:
//! the unlock delivering a grant, or the waiter leaving (cancelled or out of time).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::hash::Seeded;

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
    /// Granted by another client's unlock to the waiter its client named
    /// (`docs/protocol.md` 2.7), not handed over by this client; `sent` is then when
    /// the waiter's attempt that named it was sent.
    pub(crate) direct: bool,
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
    /// The number and send time of the waiter's latest attempt that may have named it
    /// the taker of a direct grant (`None`: never named). Only a grant to that number
    /// is taken (an older naming's grant is adopted by that attempt instead), and its
    /// lease runs from that send.
    pub(crate) naming: Mutex<Option<(u64, Instant)>>,
    /// Known by its field for direct grants (see `Handover::waiter`).
    pub(crate) direct: bool,
    /// An unlock of this client that may give way to another client was sent with this
    /// waiter's naming (`docs/protocol.md` 2.7): the naming may be in Redis until the
    /// waiter ends, so a waiter that gives up withdraws it, and its attempts adopt a
    /// grant they find (and take the naming out when they get the lock).
    pub(crate) named_by_unlock: AtomicBool,
    /// A waiter that may be named and left while an unlock of its client offered it the
    /// lock: its field's in-flight guard (the table's), which the unlocking side drops
    /// once it has settled what the waiter left in Redis (see `Waiter::leave_named`).
    /// Boxed as any value: the guard is only kept alive.
    pub(crate) left_named: Mutex<Option<Box<dyn Send + Sync>>>,
}

impl Ticket {
    /// Gives the hold to the waiter. `false` if the waiter has left: the caller then
    /// owns the hold and must release it.
    pub(crate) fn deliver(&self, grant: Grant) -> bool {
        let mut s = self.state.lock();
        let delivered = match *s {
            State::Offered => {
                *s = State::Granted(grant);
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

    /// An offer that gives way to another client (`Terms::GiveWay`) will name this
    /// waiter the taker of a direct grant by `number` (`docs/protocol.md` 2.7) if the
    /// hand-over does give way. Set before the unlock is sent, since the grant's message
    /// may come before the unlock's reply; from then on the waiter counts as named (see
    /// [`named_by_unlock`](Self::named_by_unlock)) until it ends. Returns the naming it
    /// had before, which [`unname_by_unlock`](Self::unname_by_unlock) puts back if the
    /// reply shows that the unlock did not name it.
    pub(crate) fn name_by_unlock(&self, number: u64) -> Option<(u64, Instant)> {
        self.named_by_unlock.store(true, Ordering::Release);
        self.naming.lock().replace((number, Instant::now()))
    }

    /// The unlock that was to name this waiter did not give way (it handed over, or
    /// found holds left): its naming is the one it had before. It still counts as named
    /// by an unlock: an earlier one may have named it, and that naming may be there.
    pub(crate) fn unname_by_unlock(&self, before: Option<(u64, Instant)>) {
        *self.naming.lock() = before;
    }

    /// The unlock did not hand over (holds remained, or nothing was held): the waiter
    /// goes back to acquiring on its own. `false` if the waiter has left.
    pub(crate) fn revert(&self) -> bool {
        self.settle(State::Free)
    }

    /// The unlock gave way to another client's turn (see [`State::Passed`]). `false` if
    /// the waiter has left.
    pub(crate) fn pass(&self) -> bool {
        self.settle(State::Passed)
    }

    /// The unlock failed, and may have handed over before it did (see `State::Unsure`).
    /// `false` if the waiter has left: a hand-over it never learns of ends with its
    /// lease.
    pub(crate) fn unsure(&self) -> bool {
        self.settle(State::Unsure)
    }

    /// Settles an offer still in flight; `false` if the waiter left while it was.
    fn settle(&self, to: State) -> bool {
        let mut s = self.state.lock();
        let found = *s;
        if found == State::Offered {
            *s = to;
        }
        drop(s);
        self.changed.notify_one();
        found != State::Gone
    }
}

#[derive(Default)]
pub(crate) struct Queue {
    /// Sleeping, not offered, by first-wait order.
    pub(crate) sleeping: BTreeMap<u64, Arc<Ticket>>,
    /// Hand-overs in a row on this name since the last published release.
    pub(crate) streak: u32,
    /// When the streak's first hand-over was made.
    pub(crate) streak_began: Option<Instant>,
    /// When its current window began: at its first hand-over, and again at each one
    /// that Redis made past the window because nobody else waited.
    pub(crate) window_began: Option<Instant>,
    /// After this client ended a streak with a published release: until then its own
    /// new acquires of the name hold back, so that the waiters the message wakes, here
    /// and in other clients, race on equal terms with the task that just released.
    pub(crate) yield_until: Option<Instant>,
    /// When the current holder's lease ends, as the latest busy reply to a waiter here
    /// said. A task that finds others asleep here waits behind them until then at most,
    /// without asking Redis what they already know.
    pub(crate) holder_until: Option<Instant>,
    /// Every waiter that another client's unlock may grant the lock to directly, asleep
    /// or not, by holder field (`docs/protocol.md` 2.7).
    pub(crate) named: HashMap<Arc<str>, Arc<Ticket>, Seeded>,
}

impl Queue {
    /// Nothing left worth keeping: nobody asleep, no run of hand-overs still counting,
    /// no hold-back in force.
    /// `now` is read only when a time decides it (reading the clock is a noticeable
    /// part of a lock call, and most entries have no hold-back or run to time).
    pub(crate) fn idle(&self, now: impl Fn() -> Instant, window: Duration) -> bool {
        self.sleeping.is_empty()
            && self.named.is_empty()
            && self.yield_until.is_none_or(|u| u <= now())
            && (self.streak == 0 || self.window_began.is_none_or(|t| t + window <= now()))
    }
}

/// What an unlock should do with the lock on a full release.
pub(crate) enum Offer {
    /// Hand it to this waiter, on these terms.
    To(Arc<Ticket>, Terms),
    /// Publish: this client has nobody waiting.
    Publish,
    /// Publish, ending a streak of hand-overs while this client still has waiters.
    EndStreak,
}

/// When the unlock script hands the lock to an offered waiter (`docs/protocol.md` 2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Terms {
    /// Always.
    Outright,
    /// Unless another client waits in line, whose turn then comes first (2.6).
    GiveWay,
    /// The streak's window is over: only if nobody outside this client may be waiting
    /// for the lock; else the release is published and the streak ends.
    EndOfStreak,
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
