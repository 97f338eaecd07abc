//! Hand-over: a lock released while a task of the same client waits for it goes straight
//! to that task, inside the unlock script, instead of being published to every waiter.
//!
//! Without it, a contended lock costs three trips per holder: the unlock, the pub/sub
//! message, and the next waiter's acquire. With it, the unlock script writes the next
//! holder's field itself (`docs/protocol.md`, 2.2), and the unlock's reply is the grant.
//!
//! Each client keeps, per lock name, the tasks that sleep waiting for it (a [`Ticket`]
//! each, ordered by when they first waited, so hand-over is FIFO). An unlock takes the
//! oldest sleeping ticket and marks it offered; from then on that waiter sends nothing
//! itself and only waits for the outcome, so the script's grant cannot meet an acquire of
//! its own. A run of hand-overs on a name ends after `limit` of them or `window` after its
//! first; the next release is published as usual, so that waiters of other clients
//! (Redisson's among them) get their turn in the race. While tasks sleep here, a task that
//! starts waiting joins them without asking Redis (see [`Handover::behind`]).
//!
//! A ticket is settled exactly once, under its own mutex, by whichever side comes second:
//! the unlock delivering a grant, or the waiter leaving (cancelled or out of time). A grant
//! that finds its waiter gone is released by the unlocking side; a grant that arrived but
//! was never taken is released by the leaving waiter. The one hold left to run out by its
//! lease is a grant whose waiter stopped waiting for it because the unlock's future was
//! not polled for longer than the unlock's own timeouts ([`Waiter::abandon_offer`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Default for [`ClientBuilder::handover_limit`](crate::ClientBuilder::handover_limit):
/// hand-overs in a row on one name.
pub const DEFAULT_HANDOVER_LIMIT: u32 = 256;

/// Default for [`ClientBuilder::handover_window`](crate::ClientBuilder::handover_window):
/// how long a run of hand-overs on one name may last.
pub const DEFAULT_HANDOVER_WINDOW: Duration = Duration::from_millis(5);

/// Where one waiter's ticket stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
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
}

/// One sleeping waiter, as the unlocking side sees it.
pub(crate) struct Ticket {
    /// The waiter's holder field, written into the hash on hand-over.
    pub(crate) field: Arc<str>,
    /// The lease the waiter asked for (the watchdog timeout for watchdog locks).
    pub(crate) lease: Duration,
    /// The waiter's lock is fenced: its grant must draw a token.
    pub(crate) fenced: bool,
    seq: u64,
    state: Mutex<State>,
    changed: Notify,
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

    /// The unlock did not hand over (holds remained, or nothing was held): the waiter
    /// goes back to acquiring on its own.
    pub(crate) fn revert(&self) {
        self.settle(State::Free);
    }

    /// The unlock failed, and may have handed over before it did (see `State::Unsure`).
    /// A waiter that has left by now may hold a lock it never learns of: that hold ends
    /// with its lease.
    pub(crate) fn unsure(&self) {
        self.settle(State::Unsure);
    }

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
struct Queue {
    /// Sleeping, not offered, by first-wait order.
    sleeping: BTreeMap<u64, Arc<Ticket>>,
    /// Hand-overs in a row on this name since the last published release.
    streak: u32,
    /// When the first of them was made.
    streak_began: Option<Instant>,
    /// After this client ended a streak with a published release: until then its own
    /// new acquires of the name hold back, so that the waiters the message wakes, here
    /// and in other clients, race on equal terms with the task that just released.
    yield_until: Option<Instant>,
    /// When the current holder's lease ends, as the latest busy reply to a waiter here
    /// said. A task that finds others asleep here waits behind them until then at most,
    /// without asking Redis what they already know.
    holder_until: Option<Instant>,
}

impl Queue {
    /// Nothing left worth keeping: nobody asleep, no run of hand-overs still counting,
    /// no hold-back in force.
    fn idle(&self, now: Instant, window: Duration) -> bool {
        self.sleeping.is_empty()
            && self.yield_until.is_none_or(|u| u <= now)
            && (self.streak == 0 || self.streak_began.is_none_or(|t| t + window <= now))
    }
}

/// What an unlock should do with the lock on a full release.
pub(crate) enum Offer {
    /// Hand it to this waiter.
    To(Arc<Ticket>),
    /// Publish: this client has nobody waiting.
    Publish,
    /// Publish, ending a streak of hand-overs while this client still has waiters.
    EndStreak,
}

/// The per-client registry of sleeping waiters.
pub(crate) struct Handover {
    limit: u32,
    window: Duration,
    /// Leaves since the last sweep of idle entries.
    leaves: AtomicU64,
    next_seq: AtomicU64,
    queues: Mutex<HashMap<Arc<str>, Queue>>,
}

impl Handover {
    pub(crate) fn new(limit: u32, window: Duration) -> Handover {
        Handover {
            limit,
            window,
            leaves: AtomicU64::new(0),
            next_seq: AtomicU64::new(0),
            queues: Mutex::new(HashMap::new()),
        }
    }

    /// The oldest sleeping waiter of `name`, now marked offered, unless nobody sleeps or
    /// the streak is used up: `limit` hand-overs, or `window` since the first (then this
    /// release is published, and the streak starts again). The count bounds a hot loop;
    /// the window bounds, in time, how long waiters of other clients wait behind ours.
    pub(crate) fn offer(&self, name: &str) -> Offer {
        if self.limit == 0 {
            return Offer::Publish;
        }
        let mut queues = self.queues.lock();
        let Some(queue) = queues.get_mut(name) else {
            return Offer::Publish;
        };
        if queue.sleeping.is_empty() {
            // A run still counting, or a hold-back, outlives a moment without sleepers.
            if queue.idle(Instant::now(), self.window) {
                queues.remove(name);
            }
            return Offer::Publish;
        }
        let now = Instant::now();
        let expired = queue
            .streak_began
            .is_some_and(|t| now.saturating_duration_since(t) >= self.window);
        if queue.streak >= self.limit || (queue.streak > 0 && expired) {
            queue.streak = 0;
            queue.streak_began = None;
            return Offer::EndStreak;
        }
        let Some((_, ticket)) = queue.sleeping.pop_first() else {
            return Offer::Publish;
        };
        if queue.streak == 0 {
            queue.streak_began = Some(now);
        }
        queue.streak += 1;
        *ticket.state.lock() = State::Offered;
        Offer::To(ticket)
    }

    /// An offer of `name` was not handed over after all (the release was partial, or
    /// failed): it leaves the streak as it was before.
    pub(crate) fn withdraw(&self, name: &str) {
        if let Some(q) = self.queues.lock().get_mut(name) {
            q.streak = q.streak.saturating_sub(1);
            if q.streak == 0 {
                q.streak_began = None;
            }
        }
    }

    /// Holds back this client's new acquires of `name` for `period` (see `yield_until`).
    pub(crate) fn hold_back(&self, name: &str, period: Duration) {
        if let Some(q) = self.queues.lock().get_mut(name) {
            q.yield_until = Some(Instant::now() + period);
        }
    }

    /// Whether tasks of this client already sleep waiting for `name`, and until when the
    /// holder's lease is known to last. A new waiter then joins them without an attempt
    /// of its own: the lock is held (that is why they sleep), and it is handed to them in
    /// order. `None` when nobody sleeps or the known lease has run out.
    pub(crate) fn behind(&self, name: &str) -> Option<Instant> {
        let queues = self.queues.lock();
        let q = queues.get(name)?;
        if q.sleeping.is_empty() {
            return None;
        }
        let until = q.holder_until?;
        (until > Instant::now()).then_some(until)
    }

    /// Until when new acquires of `name` hold back, if they do now.
    pub(crate) fn held_back(&self, name: &str) -> Option<Instant> {
        let queues = self.queues.lock();
        let until = queues.get(name)?.yield_until?;
        (until > Instant::now()).then_some(until)
    }

    /// A waiter of `name` that will sleep between attempts; it is not in the queue
    /// until it [`park`](Waiter::park)s.
    pub(crate) fn waiter(
        self: &Arc<Self>,
        name: &Arc<str>,
        field: &Arc<str>,
        lease: Duration,
        fenced: bool,
    ) -> Waiter {
        Waiter {
            hub: self.clone(),
            name: name.clone(),
            ticket: Arc::new(Ticket {
                field: field.clone(),
                lease,
                fenced,
                seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
                state: Mutex::new(State::Free),
                changed: Notify::new(),
            }),
        }
    }

    fn remove(&self, name: &Arc<str>, seq: u64) {
        let now = Instant::now();
        let mut queues = self.queues.lock();
        if let Some(q) = queues.get_mut(name) {
            q.sleeping.remove(&seq);
            // A run outlives an empty queue while it counts: two tasks trading the lock
            // would otherwise reset it at every turn and shut other clients out.
            if q.idle(now, self.window) {
                queues.remove(name);
            }
        }
        // Entries of names nobody touches again (their last holder lost the lock, say)
        // are swept now and then.
        if self.leaves.fetch_add(1, Ordering::Relaxed) % 1024 == 1023 {
            queues.retain(|_, q| !q.idle(now, self.window));
        }
    }
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
}

/// One waiting task's ticket. Dropping it leaves the queue; see [`Waiter::leave`].
pub(crate) struct Waiter {
    hub: Arc<Handover>,
    name: Arc<str>,
    ticket: Arc<Ticket>,
}

impl Waiter {
    /// Joins the queue for the sleep that follows; `holder_until` is when the holder's
    /// lease ends, if the last busy reply said.
    pub(crate) fn park(&self, holder_until: Option<Instant>) {
        let mut queues = self.hub.queues.lock();
        if *self.ticket.state.lock() == State::Free {
            let q = queues.entry(self.name.clone()).or_default();
            q.sleeping.insert(self.ticket.seq, self.ticket.clone());
            if holder_until.is_some() {
                q.holder_until = holder_until;
            }
        }
    }

    /// Completes when an unlock has picked this waiter, or settled an offer to it.
    /// May complete early (a stale wake-up): [`unpark`](Self::unpark) tells.
    pub(crate) async fn picked(&self) {
        let changed = self.ticket.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if *self.ticket.state.lock() != State::Free {
            return;
        }
        changed.await;
    }

    /// Leaves the queue after a sleep and says what happened meanwhile. A grant is taken
    /// (the ticket is free again).
    pub(crate) fn unpark(&self) -> Woke {
        self.hub.remove(&self.name, self.ticket.seq);
        let mut s = self.ticket.state.lock();
        match *s {
            State::Offered => Woke::Offered,
            State::Granted(g) => {
                *s = State::Free;
                Woke::Granted(g)
            }
            State::Unsure => {
                *s = State::Free;
                Woke::Unsure
            }
            State::Free | State::Gone | State::Abandoned => Woke::Free,
        }
    }

    /// Waits until an offer is settled, and says how (never [`Woke::Offered`]).
    pub(crate) async fn outcome(&self) -> Woke {
        loop {
            let changed = self.ticket.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if *self.ticket.state.lock() != State::Offered {
                return self.unpark();
            }
            changed.await;
        }
    }

    /// Stops waiting for an offer that is not settled in time (its unlock's future is not
    /// being polled, say), and goes on with a fresh ticket in its old place. A grant that
    /// arrives later is neither taken nor released: it ends with its lease, so that a
    /// release by field cannot hit a hold this task takes meanwhile. Says what happened
    /// if the offer was settled after all.
    pub(crate) fn abandon_offer(&mut self) -> Woke {
        {
            let mut s = self.ticket.state.lock();
            if *s != State::Offered {
                drop(s);
                return self.unpark();
            }
            *s = State::Abandoned;
        }
        self.ticket = Arc::new(Ticket {
            field: self.ticket.field.clone(),
            lease: self.ticket.lease,
            fenced: self.ticket.fenced,
            seq: self.ticket.seq,
            state: Mutex::new(State::Free),
            changed: Notify::new(),
        });
        Woke::Free
    }

    /// Leaves for good. Returns a grant that arrived and was never taken: the caller
    /// must release that hold. An offer still in flight is left to the unlocking side,
    /// which releases the hold if it is granted.
    pub(crate) fn leave(&self) -> Option<Grant> {
        self.hub.remove(&self.name, self.ticket.seq);
        let mut s = self.ticket.state.lock();
        let left = match *s {
            State::Granted(g) => Some(g),
            _ => None,
        };
        *s = State::Gone;
        left
    }
}

#[cfg(test)]
mod tests;
