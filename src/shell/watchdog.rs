//! The watchdog: one timer per client that keeps the leases of held locks alive, and
//! tells their guards when one is lost.
//!
//! The holds it renews are the watchdog holds of the client's table ([`crate::state`]),
//! which also counts a task's nested holds (`docs/protocol.md`, "Local re-entry").
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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::background::Background;
use crate::config::Config;
use crate::identity::Kind;
use crate::state::{Core, WatchEntry};
use crate::stats::{Counters, Event};
use crate::wire::connection::Conn;
use crate::wire::raw;

mod permits;

pub(crate) use permits::{give_back, Held, WatchedPermit};

/// Why an entry is lost when its confirmed lease ran out.
const EXPIRED: &str = "lease ran out before a renewal succeeded";

/// Sends of one renewal batch within a period.
const RENEW_ATTEMPTS: u64 = 3;

/// Keys renewed by one script call (Redisson's `lockWatchdogBatchSize`).
pub const BATCH: usize = 100;

struct Shared {
    conn: Conn,
    lease: Duration,
    core: Arc<Core>,
    /// Expirable permits held in watchdog mode.
    permits: permits::Registry,
    passes: std::sync::atomic::AtomicU64,
    /// The runtime the timer runs on, where the client's background work goes.
    home: Mutex<Handle>,
    /// False once the timer's task was dropped while the client lived: its runtime
    /// shut down. The next lock taken moves the timer to the runtime it runs on.
    timer_alive: AtomicBool,
    /// Set by [`Watchdog::stop`]: the client shut down, and the timer stays stopped.
    stopped: AtomicBool,
    background: Arc<Background>,
    stats: Arc<Counters>,
}

/// The per-client renewal timer over the table's watchdog holds.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

impl Watchdog {
    pub(crate) fn start(
        conn: Conn,
        config: &Config,
        runtime: &Handle,
        background: &Arc<Background>,
        core: Arc<Core>,
        stats: Arc<Counters>,
    ) -> Watchdog {
        let shared = Arc::new(Shared {
            conn,
            lease: config.watchdog_timeout,
            core,
            permits: Default::default(),
            passes: Default::default(),
            home: Mutex::new(runtime.clone()),
            timer_alive: AtomicBool::new(true),
            stopped: AtomicBool::new(false),
            background: background.clone(),
            stats,
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
        kind: Kind,
    ) -> Arc<WatchEntry> {
        // A timer stopped with its runtime would never renew this hold.
        self.ensure_timer();
        self.shared
            .core
            .add_watched(name, field, sent_at + self.shared.lease, token, kind)
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

    /// Records a watched permit of the semaphore `keys` (name, lease set, channel)
    /// taken by a request sent at `sent_at` with this watchdog's lease.
    pub(crate) fn register_permit(
        &self,
        keys: (&Arc<str>, &Arc<str>, &Arc<str>),
        id: [u8; 16],
        sent_at: Instant,
    ) -> Arc<WatchedPermit> {
        self.ensure_timer();
        self.shared
            .permits
            .add(keys, id, sent_at + self.shared.lease)
    }

    /// Stops renewing `entry`, before its release is sent; whether it was still renewed
    /// (false once it was found lost).
    pub(crate) fn release_permit(&self, entry: &Arc<WatchedPermit>) -> bool {
        self.shared.permits.remove(entry)
    }

    /// Records the permits of a new guard (see [`permits::Registry::hold`]).
    pub(crate) fn hold_permits(&self, held: Held) -> u64 {
        self.shared.permits.hold(held)
    }

    /// Forgets a guard's permits; whether the caller is to give them back.
    pub(crate) fn unhold_permits(&self, key: u64) -> bool {
        self.shared.permits.unhold(key)
    }

    /// Every guard's permits, taken for shutdown; no permit is renewed after this.
    pub(crate) fn drain_permits(&self) -> Vec<Held> {
        self.shared.permits.drain()
    }

    /// Whether the watched permit is lost, as [`check_lost`](Self::check_lost).
    pub(crate) fn check_permit_lost(&self, entry: &Arc<WatchedPermit>) -> bool {
        if entry.lost.is_set() {
            return true;
        }
        if entry.expired() {
            self.shared.permits.mark_lost(entry, EXPIRED);
            entry.lost.set();
            return true;
        }
        false
    }

    /// Completes when the watched permit is lost.
    pub(crate) async fn permit_lost(&self, entry: &Arc<WatchedPermit>) {
        loop {
            if self.check_permit_lost(entry) {
                return;
            }
            tokio::select! {
                _ = entry.lost.wait() => return,
                _ = tokio::time::sleep_until(entry.valid_until()) => {}
            }
        }
    }

    /// Stops the timer for good (the client shuts down).
    pub(crate) fn stop(&self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
    }

    /// The watchdog lease.
    pub(crate) fn lease(&self) -> Duration {
        self.shared.lease
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
        for entry in shared.core.all_watched() {
            shared.mark_lost(&entry, "the runtime that ran the watchdog shut down");
        }
        for entry in shared.permits.all() {
            shared
                .permits
                .mark_lost(&entry, "the runtime that ran the watchdog shut down");
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
        let permits = self.permits.renew_all(&self.conn, self.lease);
        futures_util::future::join(permits, self.clone().pass_locks()).await;
    }

    async fn pass_locks(self: Arc<Self>) {
        let now = Instant::now();
        // Renewing a lease that ran out could revive a lock someone else may have had
        // meanwhile.
        let due: Vec<(Arc<WatchEntry>, bool)> = self
            .core
            .all_watched()
            .into_iter()
            .map(|e| {
                let renewable = e.valid_until() > now;
                (e, renewable)
            })
            .collect();
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
        // On a cluster one script may only touch one slot's keys; read holds have a
        // renew script of their own.
        let groups: Vec<Vec<Arc<WatchEntry>>> = self
            .conn
            .group_by_slot(live, |e| e.name.as_bytes())
            .into_iter()
            .flat_map(|g| {
                let (read, other): (Vec<_>, Vec<_>) =
                    g.into_iter().partition(|e| e.kind == Kind::Read);
                [read, other]
            })
            .filter(|g| !g.is_empty())
            .collect();
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
            let renewed = if chunk.first().is_some_and(|e| e.kind == Kind::Read) {
                raw::renew_read(&self.conn, &pairs, self.lease).await
            } else {
                raw::renew(&self.conn, &pairs, self.lease).await
            };
            let err = match renewed {
                Ok(results) => {
                    let mut n = 0;
                    for (entry, renewed) in chunk.iter().zip(results) {
                        if renewed {
                            entry.extend(sent + self.lease);
                            n += 1;
                            tracing::trace!(lock = %entry.name, "lease renewed");
                        } else {
                            self.mark_lost(entry, "key gone or held by another owner");
                        }
                    }
                    self.stats.count(Event::Renewed(n));
                    return;
                }
                Err(err) => err,
            };
            self.stats.count(Event::RenewalFailed);
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
        // An entry unlocked meanwhile is not lost, just finished.
        if self.core.drop_lost(entry) {
            tracing::warn!(lock = %entry.name, owner = %entry.field, reason = why, "lock lost while held");
            self.stats.count(Event::Lost);
            entry.lost.set();
        }
    }
}
