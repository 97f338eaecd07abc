//! The per-client table: everything a client knows about each lock name, under one mutex.
//!
//! Per name, an [`Entry`] keeps
//! - the holds of each holder field: watchdog holds (how many guards, how many of them
//!   took a hold in Redis, and the [`WatchEntry`] with the loss signal and confirmed
//!   lease), and fixed-lease holds;
//! - the requests of each field in flight (see [`InFlightGuard`]);
//! - the tasks asleep waiting for the name, in order ([`Queue`]).
//!
//! Each decision that needs more than one of these is taken in one critical section:
//! re-enter locally or send an acquire; whether a release is the field's last and whom
//! the lock is handed to; whether a lost hold's field may be swept. The watchdog walks
//! the watchdog holds; the hand-over reads the same entry's queue. An entry with nothing
//! left in it is removed at once.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::background::Signal;
use crate::hash::Seeded;
use crate::policy::run::Limits;
use crate::state::queue::Queue;

use crate::identity::Kind;
use names::Names;

pub(crate) use holds::{Begin, Handback};
pub(crate) use in_flight::InFlightGuard;

/// `(lock name, holder field)`.
pub(crate) type SlotKey = (Arc<str>, Arc<str>);

/// One lock held in watchdog mode by one holder of this client: what its guards share.
pub(crate) struct WatchEntry {
    pub(crate) name: Arc<str>,
    pub(crate) field: Arc<str>,
    pub(crate) lost: Signal,
    /// The fencing token of the hold taken in Redis; local re-entries share it.
    pub(crate) token: u64,
    /// Which renew script keeps it.
    pub(crate) kind: Kind,
    /// The latest moment the lease is known to last: send time of the last successful
    /// acquire or renewal, plus the lease. Measured on our monotonic clock, from when the
    /// request was sent, so it errs early.
    valid_until: Mutex<Instant>,
    /// When the client learnt that the hold was taken (its reply came back).
    pub(crate) taken: Instant,
}

impl WatchEntry {
    pub(crate) fn extend(&self, until: Instant) {
        let mut v = self.valid_until.lock();
        if until > *v {
            *v = until;
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock()
    }

    /// Whether the lease the client last confirmed has run out, measured now. Once it
    /// has, the hold is lost for good: a renewal still in flight may yet succeed, but
    /// the holder may already have been told (or have acted as if) it was lost.
    pub(crate) fn expired(&self) -> bool {
        self.valid_until() <= Instant::now()
    }

    pub(crate) fn live(&self) -> bool {
        !self.lost.is_set() && !self.expired()
    }
}

struct Watched {
    /// Watchdog guards alive for this holder.
    guards: u32,
    /// How many of them took a hold in Redis (normally 1: the rest re-entered locally).
    remote: u32,
    entry: Arc<WatchEntry>,
}

/// A release of a field that no send of which was answered: a copy of it may still
/// reach Redis. The field's next acquire first sends it again, as a retry, so that any
/// copy arriving after that finds its outcome in the latch instead of releasing the new
/// hold (`release::settle_unanswered`).
#[derive(Clone, Debug)]
pub(crate) struct Unanswered {
    /// The release's latch, named by its request id.
    pub(crate) latch: String,
    /// When its first send went out: past `raw::LATE_COPIES` its latch may be gone, and
    /// it is no longer sent again.
    pub(crate) sent: Instant,
    pub(crate) holds: u32,
    pub(crate) keep: Option<Duration>,
}

/// What the client knows of one holder field of one name.
struct Holder {
    /// The layout of the holds (set when one is taken; a field holds one kind).
    kind: Kind,
    watched: Option<Watched>,
    /// Fixed-lease guards alive, and when the last of their leases ends.
    fixed: u32,
    fixed_until: Option<Instant>,
    /// Requests that change the field's holds, in flight.
    in_flight: u32,
    /// Told when `in_flight` drops to 0; made only when someone waits for that.
    settled: Option<Arc<Notify>>,
    /// Releases of the field no send of which was answered, oldest first.
    unanswered: Vec<Unanswered>,
    /// Grants handed to a waiter of the field and not yet taken up (`holds::HandedGuard`).
    handed: u32,
    /// Of `in_flight`, the marks of offers to the field (`holds::OfferedGuard`).
    offering: u32,
}

impl Default for Holder {
    fn default() -> Holder {
        Holder {
            kind: Kind::Plain,
            watched: None,
            fixed: 0,
            fixed_until: None,
            in_flight: 0,
            settled: None,
            unanswered: Vec::new(),
            handed: 0,
            offering: 0,
        }
    }
}

impl Holder {
    fn holds(&self) -> bool {
        self.watched.is_some() || self.fixed > 0
    }

    fn unused(&self) -> bool {
        !self.holds() && self.in_flight == 0 && self.unanswered.is_empty() && self.handed == 0
    }
}

/// One lock name's entry.
#[derive(Default)]
pub(crate) struct Entry {
    holders: HashMap<Arc<str>, Holder, Seeded>,
    queue: Queue,
    /// Acquisitions of this client waiting for the name that may stand in its line in
    /// Redis (`redisson_lock_clients:{<name>}`).
    in_line: u32,
    /// A busy answer to a waiting call put the client in that line, and neither a grant
    /// with `l` nor a leave took it out since, as far as the client knows.
    placed: bool,
}

impl Entry {
    fn empty(&self, now: impl Fn() -> Instant, window: Duration) -> bool {
        self.holders.is_empty() && self.in_line == 0 && self.queue.idle(now, window)
    }
}

/// One client's state for every lock name, and the only way the shell reaches it (see
/// [`crate::state`]).
pub(crate) struct Core {
    names: Mutex<Names>,
    /// The watchdog lease: what a partial release keeps when watchdog holds remain.
    lease: Duration,
    in_flight: AtomicUsize,
    /// Told when the last request in flight settles.
    none: Notify,
    /// Set once anyone waited in [`all_settled`](Self::all_settled) (a shutdown): until
    /// then the last request to settle tells nobody, and skips `Notify`'s lock.
    awaited: AtomicBool,
    /// The bounds on a run of hand-overs (`policy::run`); its window is also how long an
    /// idle queue's run still counts ([`Queue::idle`]).
    pub(super) limits: Limits,
    /// Leaves since the last sweep of idle entries.
    pub(super) leaves: AtomicU64,
    /// The next waiter's place in its queue.
    pub(super) next_seq: AtomicU64,
}

impl Core {
    /// `lease`: the watchdog lease; `limits`: the bounds on a run of hand-overs.
    pub(crate) fn new(lease: Duration, limits: Limits) -> Core {
        Core {
            names: Mutex::new(Names::default()),
            lease,
            in_flight: AtomicUsize::new(0),
            none: Notify::new(),
            awaited: AtomicBool::new(false),
            limits,
            leaves: AtomicU64::new(0),
            next_seq: AtomicU64::new(0),
        }
    }

    /// Runs `f` on the entry of `name` (made if missing), and removes the entry if
    /// nothing is left in it. One lookup, made, found or removed alike (a pair empties
    /// and remakes its name's entry twice).
    fn with<R>(&self, name: &Arc<str>, f: impl FnOnce(&mut Entry) -> R) -> R {
        let mut guard = self.names.lock();
        let names = &mut *guard;
        let mut slot = match names.map.entry(name.clone()) {
            // Nothing was left in it when last touched but a run still counting, which
            // has run out since: as good as new, as if removed then. Its run must not
            // end the next contention's first hand-over.
            MapEntry::Occupied(mut o) => {
                if o.get().empty(Instant::now, self.limits.window) {
                    o.get_mut().queue = Queue::default();
                }
                o
            }
            MapEntry::Vacant(v) => v.insert_entry(names.spare.pop().unwrap_or_default()),
        };
        let r = f(slot.get_mut());
        if slot.get().empty(Instant::now, self.limits.window) {
            let emptied = slot.remove();
            names.spare_from(emptied);
        }
        r
    }

    /// Runs `f` on the holder of `(name, field)` (made if missing) and its entry's queue;
    /// removes what is left unused.
    fn with_holder<R>(
        &self,
        name: &Arc<str>,
        field: &Arc<str>,
        f: impl FnOnce(&mut Holder, &mut Queue) -> R,
    ) -> R {
        self.with(name, |e| {
            let mut holder = match e.holders.entry(field.clone()) {
                MapEntry::Occupied(o) => o,
                MapEntry::Vacant(v) => v.insert_entry(Holder::default()),
            };
            let r = f(holder.get_mut(), &mut e.queue);
            if holder.get().unused() {
                holder.remove();
            }
            r
        })
    }

    fn peek<R>(&self, name: &str, field: &str, f: impl FnOnce(&Holder) -> R) -> Option<R> {
        let names = self.names.lock();
        names.get(name)?.holders.get(field).map(f)
    }

    /// Runs `f` on the queue of `name`.
    pub(super) fn with_queue<R>(&self, name: &Arc<str>, f: impl FnOnce(&mut Queue) -> R) -> R {
        self.with(name, |e| f(&mut e.queue))
    }

    /// Runs `f` on the queue of `name` if there is an entry.
    pub(super) fn peek_queue<R>(&self, name: &str, f: impl FnOnce(&Queue) -> R) -> Option<R> {
        self.names.lock().get(name).map(|e| f(&e.queue))
    }

    /// One more waiting acquisition of `name` that may put this client in line.
    /// How many waiters of this client joined the line of `name` and have not left.
    pub(crate) fn in_line(&self, name: &str) -> u32 {
        self.names.lock().get(name).map_or(0, |e| e.in_line)
    }

    pub(crate) fn join_line(&self, name: &Arc<str>) {
        self.with(name, |e| e.in_line += 1);
    }

    /// One fewer; `true` when it was the last.
    pub(crate) fn leave_line(&self, name: &Arc<str>) -> bool {
        self.with(name, |e| {
            e.in_line = e.in_line.saturating_sub(1);
            e.in_line == 0
        })
    }

    /// How many waiters of this client are counted in the line of `name` ([`in_line`](Self::in_line)),
    /// and whether the client may stand in it in Redis (`placed`): a first attempt
    /// granted then takes it out (`l`) when no other waiter is counted, since the
    /// waiter that put it there may have left without taking it out (it left that to a
    /// waiter counted after it, this one). One look, for an attempt's line flag.
    pub(crate) fn line_of(&self, name: &str) -> (u32, bool) {
        self.names
            .lock()
            .get(name)
            .map_or((0, false), |e| (e.in_line, e.placed))
    }

    /// The client was put in the line of `name` (`true`), or taken out (`false`).
    pub(crate) fn set_placed(&self, name: &Arc<str>, placed: bool) {
        self.with(name, |e| e.placed = placed);
    }

    /// Whether the client holds `(name, field)` (watchdog or fixed lease).
    pub(crate) fn holds(&self, name: &str, field: &str) -> bool {
        self.peek(name, field, Holder::holds).unwrap_or(false)
    }

    /// The live watchdog hold of `(name, field)` that covers a fixed lease of the same
    /// field ending at `expires`: taken before that lease ran out, so the watchdog has
    /// kept the key alive without a gap since. The fixed hold lives as long as it does.
    pub(crate) fn cover(
        &self,
        name: &str,
        field: &str,
        expires: Instant,
    ) -> Option<Arc<WatchEntry>> {
        self.peek(name, field, |h| {
            h.watched
                .as_ref()
                .filter(|w| w.entry.taken < expires && w.entry.live())
                .map(|w| w.entry.clone())
        })
        .flatten()
    }

    /// Whether `(name, field)` has a watchdog hold (alive or not yet found lost).
    pub(crate) fn watched(&self, name: &str, field: &str) -> bool {
        self.peek(name, field, |h| h.watched.is_some())
            .unwrap_or(false)
    }

    /// Watchdog guards of `(name, field)` that re-entered locally, so the hash does not
    /// count them.
    pub(crate) fn local_holds(&self, name: &str, field: &str) -> u32 {
        self.peek(name, field, |h| {
            h.watched
                .as_ref()
                .map_or(0, |w| w.guards.saturating_sub(w.remote))
        })
        .unwrap_or(0)
    }

    /// Every watchdog hold, for a renewal pass.
    pub(crate) fn all_watched(&self) -> Vec<Arc<WatchEntry>> {
        let names = self.names.lock();
        names
            .values()
            .flat_map(|e| e.holders.values())
            .filter_map(|h| h.watched.as_ref().map(|w| w.entry.clone()))
            .collect()
    }

    /// Drops `entry` as lost if it is still the field's watchdog hold; `false` if it was
    /// unlocked (or replaced) meanwhile.
    pub(crate) fn drop_lost(&self, entry: &Arc<WatchEntry>) -> bool {
        self.with_holder(&entry.name, &entry.field, |h, _| {
            if matches!(&h.watched, Some(w) if Arc::ptr_eq(&w.entry, entry)) {
                h.watched = None;
                true
            } else {
                false
            }
        })
    }

    /// Forgets every watchdog hold of `name` (after a force unlock), marking each lost.
    /// Fixed-lease guards keep their count: each still gives back its own hold.
    pub(crate) fn forget_name(&self, name: &Arc<str>) {
        self.with(name, |e| {
            e.holders.retain(|_, h| {
                if let Some(w) = h.watched.take() {
                    w.entry.lost.set();
                }
                !h.unused()
            })
        });
    }

    /// Forgets every hold (the client shuts down), marking watchdog holds lost. Returns
    /// the `(name, field)` of each and its kind, for their releases.
    pub(crate) fn drain(&self) -> Vec<(SlotKey, Kind)> {
        let mut names = self.names.lock();
        let mut held = Vec::new();
        for (name, e) in names.iter_mut() {
            e.holders.retain(|field, h| {
                // A field whose release got no answer may still hold, and one handed a
                // grant not yet taken up does: released whole.
                if h.holds() || !h.unanswered.is_empty() || h.handed > 0 {
                    held.push(((name.clone(), field.clone()), h.kind));
                }
                h.unanswered.clear();
                if let Some(w) = h.watched.take() {
                    w.entry.lost.set();
                }
                h.fixed = 0;
                !h.unused()
            });
        }
        let now = Instant::now();
        names.retain(|_, e| !e.empty(|| now, self.limits.window));
        held
    }

    /// Drops entries nothing is left in (a run of hand-overs that stopped counting, say).
    pub(super) fn sweep_idle(&self) {
        let now = Instant::now();
        self.names
            .lock()
            .retain(|_, e| !e.empty(|| now, self.limits.window));
    }

    /// Names with an entry now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.names.lock().len()
    }

    /// Emptied entries kept for reuse.
    #[cfg(test)]
    pub(crate) fn spare(&self) -> usize {
        self.names.lock().spare.len()
    }

    /// What the entry of `name` (made if missing) holds: holder fields, waiters in line.
    #[cfg(test)]
    pub(crate) fn contents(&self, name: &Arc<str>) -> (usize, u32) {
        self.with(name, |e| (e.holders.len(), e.in_line))
    }
}

mod holds;
mod in_flight;
mod names;
#[cfg(test)]
mod tests;
