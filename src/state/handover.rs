//! Hand-over: a lock released while a task of the same client waits for it goes straight
//! to that task, inside the unlock script, instead of being published to every waiter.
//!
//! Without it, a contended lock costs three trips per holder: the unlock, the pub/sub
//! message, and the next waiter's acquire. With it, the unlock script writes the next
//! holder's field itself (`docs/protocol.md`, 2.2), and the unlock's reply is the grant.
//!
//! The client's table keeps, per lock name, the tasks that sleep waiting for it (a
//! [`Ticket`] each, ordered by when they first waited, so hand-over is FIFO; see
//! [`crate::state::queue`]). An unlock takes the
//! oldest sleeping ticket and marks it offered; from then on that waiter sends nothing
//! itself and only waits for the outcome, so the script's grant cannot meet an acquire of
//! its own. A run of hand-overs on a name is bounded by `policy::run` (its count, its
//! window, and 16 windows whoever waits); the release that ends it is published as
//! usual, so that waiters of other clients (Redisson's among them) get their turn in the
//! race. While tasks sleep here, a task that
//! starts waiting joins them without asking Redis (see [`Core::behind`]).
//!
//! A ticket is settled exactly once, under its own mutex, by whichever side comes second:
//! the unlock delivering a grant, or the waiter leaving (cancelled or out of time). A grant
//! that finds its waiter gone is released by the unlocking side; a grant that arrived but
//! was never taken is released by the leaving waiter. The one hold nobody releases is a
//! grant whose waiter stopped waiting for it because the unlock's future was not polled
//! for longer than the unlock's own timeouts ([`Waiter::abandon_offer`]): it ends with its
//! lease, or the field's next call adopts it (`acquire.lua`'s `f`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::policy::run::{Next, Settled};
use crate::state::queue::{since_origin, Grant, Offer, Queue, State, Terms, Ticket, Woke};
use crate::state::table::Core;

/// Default for [`ClientBuilder::handover_limit`](crate::ClientBuilder::handover_limit):
/// hand-overs in a row on one name.
pub const DEFAULT_HANDOVER_LIMIT: u32 = 256;

/// Default for [`ClientBuilder::handover_window`](crate::ClientBuilder::handover_window):
/// how long a run of hand-overs on one name may last.
pub const DEFAULT_HANDOVER_WINDOW: Duration = Duration::from_millis(5);

impl Core {
    /// The oldest sleeping waiter of `name`, now marked offered (see [`pick`](Self::pick)).
    #[cfg(test)]
    pub(crate) fn offer(&self, name: &str) -> Offer {
        let name: Arc<str> = name.into();
        self.with_queue(&name, |q| self.pick(q, true, &|_| false))
            .unwrap_or(Offer::Publish)
    }

    /// The oldest sleeping waiter in `queue`, now marked offered, unless nobody sleeps or
    /// the run decides otherwise ([`Run::next`](crate::policy::run::Run::next): its count or its window is used up, and
    /// the release is published). `None`: publish, as if this client had no waiter.
    ///
    /// `listening`: this client's own subscription to the lock's channel is confirmed,
    /// so that the one subscriber the script allows is this client.
    ///
    /// `busy`: whether a field has a request in flight. Its waiters are passed over: a
    /// retry of that request could take a hold handed over meanwhile for its own grant.
    pub(super) fn pick(
        &self,
        queue: &mut Queue,
        listening: bool,
        busy: &dyn Fn(&str) -> bool,
    ) -> Option<Offer> {
        let asleep = !queue.sleeping.is_empty();
        if !asleep && queue.run.streak() == 0 {
            // The common release: nobody to hand to, and no run to time.
            return None;
        }
        let now = since_origin(Instant::now());
        let terms = match queue.run.release(now, &self.limits, listening, asleep) {
            Next::Publish => return None,
            Next::End { gap } => return Some(Offer::EndStreak { gap }),
            Next::Offer(terms) => terms,
        };
        let seq = queue
            .sleeping
            .iter()
            .find(|(_, t)| !busy(&t.field))
            .map(|(seq, _)| *seq)?;
        let ticket = queue.sleeping.remove(&seq)?;
        queue.run.offered(now, terms);
        *ticket.state.lock() = State::Offered;
        Some(Offer::To(ticket, terms))
    }

    /// The release that carried an offer of `name` on `terms` came out so (see
    /// [`Run::settled`](crate::policy::run::Run::settled)).
    pub(crate) fn offer_settled(&self, name: &Arc<str>, terms: Terms, outcome: Settled) {
        self.with_queue(name, |q| q.run.settled(terms, outcome));
    }

    /// Whether a streak past its window may go on when Redis finds nobody else waiting.
    pub(crate) fn asks_at_end(&self) -> bool {
        self.limits.asks_at_end
    }

    /// Holds back this client's new acquires of `name` for `period` (see `yield_until`).
    pub(crate) fn hold_back(&self, name: &Arc<str>, period: Duration) {
        self.with_queue(name, |q| q.yield_until = Some(Instant::now() + period));
    }

    /// Whether tasks of this client already sleep waiting for `name`, and until when the
    /// holder's lease is known to last. A new waiter then joins them without an attempt
    /// of its own: the lock is held (that is why they sleep), and it is handed to them in
    /// order. `None` when nobody sleeps or the known lease has run out.
    pub(crate) fn behind(&self, name: &str) -> Option<Instant> {
        let until = self
            .peek_queue(name, |q| {
                if q.sleeping.is_empty() {
                    None
                } else {
                    q.holder_until
                }
            })
            .flatten()?;
        (until > Instant::now()).then_some(until)
    }

    /// Wakes the sleeping waiters of `field` on `name`: the lock was just handed to
    /// another call of the same field (two futures of one task joined), which they may
    /// now re-enter instead of sleeping until the last holder's lease ends.
    pub(crate) fn wake_field(&self, name: &Arc<str>, field: &str) {
        self.with_queue(name, |q| {
            for t in q.sleeping.values().filter(|t| &*t.field == field) {
                t.changed.notify_one();
            }
        });
    }

    /// Until when new acquires of `name` hold back, if they do now.
    pub(crate) fn held_back(&self, name: &str) -> Option<Instant> {
        let until = self.peek_queue(name, |q| q.yield_until).flatten()?;
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
        let ticket = Arc::new(Ticket {
            field: field.clone(),
            lease,
            fenced,
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State::Free),
            changed: Notify::new(),
            mark: Mutex::new(None),
        });
        Waiter {
            core: self.clone(),
            name: name.clone(),
            ticket,
        }
    }

    fn remove(&self, name: &Arc<str>, seq: u64) {
        self.with_queue(name, |q| {
            q.sleeping.remove(&seq);
        });
        // Entries of names nobody touches again (a run of hand-overs that stopped
        // counting, say) are swept now and then.
        if self.leaves.fetch_add(1, Ordering::Relaxed) % 1024 == 1023 {
            self.sweep_idle();
        }
    }
}

/// One waiting task's ticket. Dropping it leaves the queue; see [`Waiter::leave`].
pub(crate) struct Waiter {
    core: Arc<Core>,
    name: Arc<str>,
    ticket: Arc<Ticket>,
}

impl Waiter {
    /// Joins the queue for the sleep that follows; `holder_until` is when the holder's
    /// lease ends, if the last busy reply said.
    pub(crate) fn park(&self, holder_until: Option<Instant>) {
        self.core.with_queue(&self.name, |q| {
            if *self.ticket.state.lock() == State::Free {
                q.sleeping.insert(self.ticket.seq, self.ticket.clone());
                if holder_until.is_some() {
                    q.holder_until = holder_until;
                }
            }
        });
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

    /// The mark that keeps this waiter's field in flight while a grant handed to it is
    /// taken up (see `Ticket::deliver`): the caller drops it once the hold is registered
    /// or given back.
    pub(crate) fn take_mark(&self) -> Option<Box<dyn Send>> {
        self.ticket.mark.lock().take()
    }

    /// Leaves the queue after a sleep and says what happened meanwhile. A grant is taken
    /// (the ticket is free again).
    pub(crate) fn unpark(&self) -> Woke {
        self.core.remove(&self.name, self.ticket.seq);
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
            State::Passed => {
                *s = State::Free;
                Woke::Passed
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
    /// arrives later is neither taken nor released: it ends with its lease unless this
    /// field's next call adopts it, so that a release by field cannot hit a hold this
    /// task takes meanwhile. Says what happened
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
        let ticket = Arc::new(Ticket {
            field: self.ticket.field.clone(),
            lease: self.ticket.lease,
            fenced: self.ticket.fenced,
            seq: self.ticket.seq,
            state: Mutex::new(State::Free),
            changed: Notify::new(),
            mark: Mutex::new(None),
        });
        self.ticket = ticket;
        Woke::Free
    }

    /// Leaves for good. Returns a grant that arrived and was never taken: the caller
    /// must release that hold. An offer still in flight is left to the unlocking side,
    /// which releases the hold if it is granted: [`Left::Offered`].
    pub(crate) fn leave(&self) -> Left {
        self.core.remove(&self.name, self.ticket.seq);
        let mut s = self.ticket.state.lock();
        let left = match *s {
            State::Granted(g) => Left::Granted(g),
            State::Offered => Left::Offered,
            _ => Left::Empty,
        };
        *s = State::Gone;
        left
    }
}

/// What a waiter left behind (see [`Waiter::leave`]).
pub(crate) enum Left {
    /// A grant it never took.
    Granted(Grant),
    /// An offer of this client's unlock, still in flight: the unlock settles the hold.
    Offered,
    /// Nothing of this client's.
    Empty,
}

#[cfg(test)]
mod tests;
