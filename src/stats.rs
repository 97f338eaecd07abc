//! What a client has done, counted: [`Client::stats`](crate::Client::stats) reads the
//! counts, and with the `metrics` feature every event also goes to the [`metrics`] facade
//! (counters named `rlock_*_total`, and histograms of waiting, holding and hand-off times
//! in seconds), for whichever recorder the service installed.
//!
//! [`metrics`]: https://docs.rs/metrics

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A snapshot of one client's counts since it was built ([`Client::stats`]).
///
/// Every field only grows. Two snapshots taken apart give the rates.
///
/// [`Client::stats`]: crate::Client::stats
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Locks taken: grants from Redis, local re-entries and hand-overs received.
    pub acquisitions: u64,
    /// Acquire attempts Redis answered with "held by someone else".
    pub busy: u64,
    /// Holds given back by an unlock or a dropped guard (local re-entries included),
    /// counted when the release starts: an unlock that then fails counts too.
    pub releases: u64,
    /// Leases renewed by the watchdog (one per lock per successful renewal).
    pub renewals: u64,
    /// Renewal calls that failed (timeouts, broken connections); retried.
    pub renewal_failures: u64,
    /// Holds found lost while held (key gone or taken, lease run out, runtime gone).
    pub leases_lost: u64,
    /// Releases handed straight to a waiting task of this client.
    pub handovers: u64,
    /// Waiters woken by a message on their channel: an unlock, a semaphore's release or
    /// a latch's count; or when the pub/sub connection is made, the first time included,
    /// so that each waiter of the client then checks again (one more busy attempt each).
    pub wakeups: u64,
    /// Times the pub/sub connection was (re)established.
    pub pubsub_connects: u64,
    /// Unlock messages that woke nobody here because the release gave the turn to
    /// another client of this crate (`docs/protocol.md` 2.6): attempts saved.
    pub turns_deferred: u64,
}

/// One event a client counts. The times only go to the `metrics` histograms.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) enum Event {
    /// A lock was taken after waiting this long (zero when it was free).
    Acquired(Duration),
    Busy,
    /// A hold was given back after being held this long.
    Released(Duration),
    Renewed(u64),
    RenewalFailed,
    Lost,
    /// A release was handed to a waiter; the grant reached it after this long.
    HandedOver(Duration),
    Woken,
    PubsubConnected,
    TurnDeferred,
}

/// The per-client counters behind [`Stats`].
#[derive(Default)]
pub(crate) struct Counters {
    acquisitions: AtomicU64,
    busy: AtomicU64,
    releases: AtomicU64,
    renewals: AtomicU64,
    renewal_failures: AtomicU64,
    leases_lost: AtomicU64,
    handovers: AtomicU64,
    wakeups: AtomicU64,
    pubsub_connects: AtomicU64,
    turns_deferred: AtomicU64,
}

impl Counters {
    pub(crate) fn count(&self, event: Event) {
        let (counter, n) = match event {
            Event::Acquired(_) => (&self.acquisitions, 1),
            Event::Busy => (&self.busy, 1),
            Event::Released(_) => (&self.releases, 1),
            Event::Renewed(n) => (&self.renewals, n),
            Event::RenewalFailed => (&self.renewal_failures, 1),
            Event::Lost => (&self.leases_lost, 1),
            Event::HandedOver(_) => (&self.handovers, 1),
            Event::Woken => (&self.wakeups, 1),
            Event::PubsubConnected => (&self.pubsub_connects, 1),
            Event::TurnDeferred => (&self.turns_deferred, 1),
        };
        counter.fetch_add(n, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        record(event, n);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            acquisitions: get(&self.acquisitions),
            busy: get(&self.busy),
            releases: get(&self.releases),
            renewals: get(&self.renewals),
            renewal_failures: get(&self.renewal_failures),
            leases_lost: get(&self.leases_lost),
            handovers: get(&self.handovers),
            wakeups: get(&self.wakeups),
            pubsub_connects: get(&self.pubsub_connects),
            turns_deferred: get(&self.turns_deferred),
        }
    }
}

#[cfg(feature = "metrics")]
fn record(event: Event, n: u64) {
    let name = match event {
        Event::Acquired(wait) => {
            metrics::histogram!("rlock_acquire_wait_seconds").record(wait.as_secs_f64());
            "rlock_acquisitions_total"
        }
        Event::Busy => "rlock_busy_total",
        Event::Released(held) => {
            metrics::histogram!("rlock_hold_seconds").record(held.as_secs_f64());
            "rlock_releases_total"
        }
        Event::Renewed(_) => "rlock_renewals_total",
        Event::RenewalFailed => "rlock_renewal_failures_total",
        Event::Lost => "rlock_leases_lost_total",
        Event::HandedOver(took) => {
            metrics::histogram!("rlock_handoff_seconds").record(took.as_secs_f64());
            "rlock_handovers_total"
        }
        Event::Woken => "rlock_wakeups_total",
        Event::PubsubConnected => "rlock_pubsub_connects_total",
        Event::TurnDeferred => "rlock_turns_deferred_total",
    };
    metrics::counter!(name).increment(n);
}
