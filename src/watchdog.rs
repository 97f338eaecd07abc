//! The watchdog: one timer per client that keeps the leases of held locks alive.
//!
//! It is also where a task's nested watchdog holds are counted: the first `lock()` of a
//! `(name, holder field)` takes a hold in Redis; while that hold is known live, further
//! watchdog acquisitions by the same holder re-enter here, without a round trip, and
//! only the release of the last of them is sent (giving back every hold the hash
//! counts for them). See `docs/protocol.md`, "Local re-entry".
//!
//! Every `watchdog_timeout / 3` the timer renews every registered `(name, holder field)`
//! with one script call per [`BATCH`] keys. Registration happens synchronously when an
//! acquire reply arrives, before `lock()` returns; deregistration happens synchronously
//! when the last hold's unlock starts, before the unlock is sent. So no renewal can be
//! scheduled after an unlock (Redisson #7272), and the renew script itself only extends a
//! key whose field is still ours.
//!
//! A renewal that finds the key gone or owned by another field marks the entry lost and
//! wakes every guard waiting in [`LockGuard::lost`](crate::LockGuard::lost). A renewal
//! that fails (timeout, broken connection) keeps the entry and tries again next period,
//! unless the lease it last confirmed has run out by then: then the lock may already be
//! someone else's, and the entry is marked lost rather than assumed held.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::background::{Background, Signal};
use crate::config::Config;
use crate::connection::Conn;
use crate::raw;

/// Why an entry is lost when its confirmed lease ran out.
const EXPIRED: &str = "lease ran out before a renewal succeeded";

/// Sends of one renewal batch within a period.
const RENEW_ATTEMPTS: u64 = 3;

/// Keys renewed by one script call (Redisson's `lockWatchdogBatchSize`).
pub const BATCH: usize = 100;

/// One lock held in watchdog mode by one holder of this client.
pub(crate) struct WatchEntry {
    pub(crate) name: Arc<str>,
    pub(crate) field: Arc<str>,
    pub(crate) lost: Signal,
    /// The fencing token of the hold taken in Redis; local re-entries share it.
    pub(crate) token: u64,
    /// The latest moment the lease is known to last: send time of the last successful
    /// acquire or renewal, plus the lease. Measured on our monotonic clock, from when the
    /// request was sent, so it errs early.
    valid_until: Mutex<Instant>,
}

impl WatchEntry {
    fn extend(&self, until: Instant) {
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
}

/// `(lock name, holder field)`.
pub(crate) type SlotKey = (Arc<str>, Arc<str>);

struct Slot {
    /// Watchdog guards alive for this holder.
    holds: u32,
    /// How many of them took a hold in Redis (normally 1: the rest re-entered locally).
    remote: u32,
    entry: Arc<WatchEntry>,
}

/// What releasing one watchdog guard leaves to do.
pub(crate) enum Released {
    /// Other guards of the holder remain: nothing to send.
    Kept,
    /// This was the last guard: give back `remote` holds in Redis.
    Last { remote: u32 },
    /// Others remain, and each of them has its own hold in Redis: give back one.
    Partial,
    /// The entry was already dropped as lost (or force-unlocked).
    Gone,
}

struct Shared {
    conn: Conn,
    lease: Duration,
    slots: Mutex<HashMap<SlotKey, Slot>>,
    passes: std::sync::atomic::AtomicU64,
    /// The runtime the timer runs on, where the client's background work goes.
    home: Mutex<Handle>,
    /// False once the timer's task was dropped while the client lived: its runtime
    /// shut down. The next lock taken moves the timer to the runtime it runs on.
    timer_alive: AtomicBool,
    /// Set by [`Watchdog::drain`]: the client shut down, and the timer stays stopped.
    stopped: AtomicBool,
    background: Arc<Background>,
}

/// The per-client registry of watchdog locks, and its timer.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

impl Watchdog {
    pub(crate) fn start(
        conn: Conn,
        config: &Config,
        runtime: &Handle,
        background: &Arc<Background>,
    ) -> Watchdog {
        let shared = Arc::new(Shared {
            conn,
            lease: config.watchdog_timeout,
            slots: Mutex::new(HashMap::new()),
            passes: Default::default(),
            home: Mutex::new(runtime.clone()),
            timer_alive: AtomicBool::new(true),
            stopped: AtomicBool::new(false),
            background: background.clone(),
        });
        shared.spawn_timer(runtime);
        Watchdog { shared }
    }

    /// The runtime for the client's background work: the one its timer runs on. If
    /// that runtime has shut down and the caller runs on another, the timer moves there
    /// first, so that locks taken from now on are renewed.
    pub(crate) fn home(&self) -> Handle {
        self.ensure_timer();
        self.shared.home.lock().clone()
    }

    /// Restarts the timer on the caller's runtime if its own runtime shut down; one
    /// atomic load when it runs.
    fn ensure_timer(&self) {
        let shared = &self.shared;
        if !shared.timer_alive.load(Ordering::SeqCst) && !shared.stopped.load(Ordering::SeqCst) {
            if let Ok(current) = Handle::try_current() {
                if shared
                    .timer_alive
                    .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    tracing::warn!("the runtime that ran this client's watchdog shut down; it now runs on the caller's runtime");
                    *shared.home.lock() = current.clone();
                    shared.spawn_timer(&current);
                }
            }
        }
    }

    /// Records one more watchdog hold of `(name, field)`, taken in Redis by a request sent
    /// at `sent_at` with fencing token `token`. Returns the entry the guard keeps.
    pub(crate) fn register(
        &self,
        name: &Arc<str>,
        field: &Arc<str>,
        sent_at: Instant,
        token: u64,
    ) -> Arc<WatchEntry> {
        let until = sent_at + self.shared.lease;
        // A timer stopped with its runtime would never renew this hold.
        self.ensure_timer();
        let mut slots = self.shared.slots.lock();
        let slot = slots
            .entry((name.clone(), field.clone()))
            .or_insert_with(|| Slot {
                holds: 0,
                remote: 0,
                entry: Arc::new(WatchEntry {
                    name: name.clone(),
                    field: field.clone(),
                    lost: Signal::default(),
                    token,
                    valid_until: Mutex::new(until),
                }),
            });
        slot.holds += 1;
        slot.remote += 1;
        slot.entry.extend(until);
        if slot.entry.valid_until() <= Instant::now() {
            // The reply was taken up after the lease it granted had run out (a future
            // left unpolled that long): the lock may be someone else's already.
            slot.entry.lost.set();
        }
        slot.entry.clone()
    }

    /// Re-enters a watchdog hold of `(name, field)` without asking Redis, if there is
    /// one whose lease is known to last (the next renewal will tell if it does not).
    /// Otherwise `Err(registered)`: whether a (lost or stale) entry is there, the same
    /// answer as [`is_registered`](Self::is_registered), under the same lock.
    pub(crate) fn reenter(
        &self,
        name: &Arc<str>,
        field: &Arc<str>,
    ) -> Result<Arc<WatchEntry>, bool> {
        let mut slots = self.shared.slots.lock();
        let Some(slot) = slots.get_mut(&(name.clone(), field.clone())) else {
            return Err(false);
        };
        if slot.entry.lost.is_set() || slot.entry.valid_until() <= Instant::now() {
            return Err(true);
        }
        slot.holds += 1;
        Ok(slot.entry.clone())
    }

    /// Drops one guard of `entry` and says what is left to send.
    pub(crate) fn release(&self, entry: &Arc<WatchEntry>) -> Released {
        let mut slots = self.shared.slots.lock();
        let key = (entry.name.clone(), entry.field.clone());
        match slots.get_mut(&key) {
            // Only the entry this guard registered: a lost-and-replaced entry is not ours.
            Some(slot) if Arc::ptr_eq(&slot.entry, entry) => {
                if slot.holds == 1 {
                    let remote = slot.remote;
                    slots.remove(&key);
                    Released::Last { remote }
                } else if slot.holds > slot.remote {
                    // Guards are interchangeable: one of the local re-entries ends.
                    slot.holds -= 1;
                    Released::Kept
                } else {
                    // Every guard took its hold in Redis (a fenced lock's re-entries).
                    slot.holds -= 1;
                    slot.remote -= 1;
                    Released::Partial
                }
            }
            _ => Released::Gone,
        }
    }

    /// Whether `entry` is lost: marked so, or its confirmed lease has run out by the
    /// monotonic clock, whether or not a watchdog pass has looked since (the timer may
    /// not have run: a blocked runtime thread, a paused process, a runtime gone).
    pub(crate) fn check_lost(&self, entry: &Arc<WatchEntry>) -> bool {
        if entry.lost.is_set() {
            return true;
        }
        if entry.expired() {
            self.shared.mark_lost(entry, EXPIRED);
            // Set even if the slot no longer holds this entry: the guard asking is lost.
            entry.lost.set();
            return true;
        }
        false
    }

    /// Completes when `entry` is lost (see [`check_lost`](Self::check_lost)).
    pub(crate) async fn lost(&self, entry: &Arc<WatchEntry>) {
        loop {
            if self.check_lost(entry) {
                return;
            }
            tokio::select! {
                _ = entry.lost.wait() => return,
                // A renewal may have moved the deadline meanwhile; checked again above.
                _ = tokio::time::sleep_until(entry.valid_until()) => {}
            }
        }
    }

    /// Watchdog holds of `(name, field)` that re-entered locally, so the hash does not
    /// count them.
    pub(crate) fn local_holds(&self, name: &Arc<str>, field: &Arc<str>) -> u32 {
        self.shared
            .slots
            .lock()
            .get(&(name.clone(), field.clone()))
            .map_or(0, |s| s.holds.saturating_sub(s.remote))
    }

    /// True if `(name, field)` has watchdog holds.
    pub(crate) fn is_registered(&self, name: &Arc<str>, field: &Arc<str>) -> bool {
        self.shared
            .slots
            .lock()
            .contains_key(&(name.clone(), field.clone()))
    }

    /// Forgets every hold (the client shuts down), marking each lost, and stops the
    /// timer for good. Returns the `(name, field)` of each, for their releases.
    pub(crate) fn drain(&self) -> Vec<SlotKey> {
        self.shared.stopped.store(true, Ordering::SeqCst);
        let slots: Vec<(SlotKey, Slot)> = self.shared.slots.lock().drain().collect();
        slots
            .into_iter()
            .map(|(key, slot)| {
                slot.entry.lost.set();
                key
            })
            .collect()
    }

    /// Forgets every holder of `name` (after a force unlock), marking them lost.
    pub(crate) fn forget_name(&self, name: &str) {
        let mut slots = self.shared.slots.lock();
        slots.retain(|(n, _), slot| {
            if &**n == name {
                slot.entry.lost.set();
                false
            } else {
                true
            }
        });
    }

    /// The watchdog lease.
    pub(crate) fn lease(&self) -> Duration {
        self.shared.lease
    }

    /// Number of locks registered now.
    #[allow(dead_code)]
    pub(crate) fn len(&self) -> usize {
        self.shared.slots.lock().len()
    }
}

/// Dropped with the timer's task. Dropped while the client lives, it means the task's
/// runtime shut down: no renewal can happen until the timer runs again elsewhere, so
/// every hold is reported lost now rather than when its lease runs out.
struct TimerTask(Weak<Shared>);

impl Drop for TimerTask {
    fn drop(&mut self) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        shared.timer_alive.store(false, Ordering::SeqCst);
        let held: Vec<Arc<WatchEntry>> = shared
            .slots
            .lock()
            .values()
            .map(|s| s.entry.clone())
            .collect();
        for entry in held {
            shared.mark_lost(&entry, "the runtime that ran the watchdog shut down");
        }
    }
}

/// `task` is an argument, not made in the body, so that it is dropped with the future
/// even if the runtime shuts down before the future was first polled.
async fn timer(task: TimerTask, period: Duration, runtime: Handle) {
    let weak = task.0.clone();
    let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(shared) = weak.upgrade() else {
            return;
        };
        // Each pass runs on its own: a slow Redis must not delay the next period's
        // renewals or its lost-lease checks.
        runtime.spawn(async move { shared.pass().await });
    }
}

impl Shared {
    fn period(&self) -> Duration {
        self.lease / 3
    }

    fn spawn_timer(self: &Arc<Self>, runtime: &Handle) {
        let task = TimerTask(Arc::downgrade(self));
        self.background
            .service(runtime, timer(task, self.period(), runtime.clone()));
    }

    async fn pass(self: Arc<Self>) {
        let now = Instant::now();
        let mut due = Vec::new();
        {
            let slots = self.slots.lock();
            for slot in slots.values() {
                if slot.entry.valid_until() <= now {
                    // Renewing now could revive a lock someone else may have had meanwhile.
                    due.push((slot.entry.clone(), false));
                } else {
                    due.push((slot.entry.clone(), true));
                }
            }
        }
        if due.is_empty() {
            return;
        }
        self.passes.fetch_add(1, Ordering::Relaxed);
        let mut live = Vec::with_capacity(due.len());
        for (entry, renewable) in due {
            if renewable {
                live.push(entry);
            } else {
                self.mark_lost(&entry, EXPIRED);
            }
        }
        // On a cluster one script may only touch one slot's keys.
        let groups = self.conn.group_by_slot(live, |e| e.name.as_bytes());
        let batches = groups
            .iter()
            .flat_map(|g| g.chunks(BATCH))
            .map(|chunk| self.renew_batch(chunk));
        futures_util::future::join_all(batches).await;
    }

    async fn renew_batch(&self, chunk: &[Arc<WatchEntry>]) {
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let sent = Instant::now();
            let pairs: Vec<(&str, &str)> = chunk.iter().map(|e| (&*e.name, &*e.field)).collect();
            let err = match raw::renew(&self.conn, &pairs, self.lease).await {
                Ok(results) => {
                    for (entry, renewed) in chunk.iter().zip(results) {
                        if renewed {
                            entry.extend(sent + self.lease);
                            tracing::trace!(lock = %entry.name, "lease renewed");
                        } else {
                            self.mark_lost(entry, "key gone or held by another owner");
                        }
                    }
                    return;
                }
                Err(err) => err,
            };
            let now = Instant::now();
            let mut live = 0;
            for entry in chunk {
                if entry.valid_until() <= now {
                    self.mark_lost(entry, EXPIRED);
                } else {
                    live += 1;
                }
            }
            // A failed renewal is sent again within this period, on the connection the
            // driver reopens: after a restart the first call finds the old one dead, and
            // waiting a period to ask again would report the lost locks a period late.
            let pause = Duration::from_millis(20 * attempt);
            if live == 0
                || !err.is_transient()
                || attempt >= RENEW_ATTEMPTS
                || started.elapsed() + pause >= self.period() / 2
            {
                tracing::warn!(locks = live, attempt, error = %err, "lease renewal failed; retrying next period");
                return;
            }
            tracing::debug!(locks = live, attempt, error = %err, "lease renewal failed; retrying now");
            tokio::time::sleep(pause).await;
        }
    }

    fn mark_lost(&self, entry: &Arc<WatchEntry>, why: &'static str) {
        let mut slots = self.slots.lock();
        let key = (entry.name.clone(), entry.field.clone());
        // An entry unlocked meanwhile is not lost, just finished.
        if matches!(slots.get(&key), Some(slot) if Arc::ptr_eq(&slot.entry, entry)) {
            slots.remove(&key);
            drop(slots);
            tracing::warn!(lock = %entry.name, owner = %entry.field, reason = why, "lock lost while held");
            entry.lost.set();
        }
    }
}
