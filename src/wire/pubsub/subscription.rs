//! One waiter's membership in a lock channel, and what its leaving does: pass on a
//! wake-up it did not use, and let the channel go, or linger while its client may wait
//! on the lock again soon.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{timers, ChannelEntry, Command, HubShared, Timer};
use crate::stats::Event;

/// One waiter's membership in a channel. Dropping it leaves the channel.
pub(crate) struct Subscription {
    hub: Arc<HubShared>,
    channel: Arc<str>,
    name: Arc<str>,
    entry: Arc<ChannelEntry>,
    /// The wake-up queue of this waiter's lock name.
    wake: Arc<Notify>,
    /// Set while this waiter has consumed a wake-up it has not yet turned into a lock.
    holding_wake: bool,
    /// A wake-up this waiter consumed was answered "another client's turn": not used,
    /// it is passed on if the waiter leaves before its next attempt settles it.
    owes_wake: bool,
    /// Whether this waiter needed the channel: it joined after a busy answer, or slept
    /// on it. One that joined a lingering channel before its first attempt and took the
    /// lock at once did not, and leaving does not keep the channel: otherwise a name
    /// used more often than [`timers::LINGER`] stayed subscribed for good after one
    /// wait, and heard every release of its own client's uncontended calls.
    needed: bool,
}

impl Subscription {
    /// A waiter of `name` that joined `entry` (counted among its waiters already).
    pub(super) fn new(
        hub: Arc<HubShared>,
        channel: Arc<str>,
        name: Arc<str>,
        entry: Arc<ChannelEntry>,
        wake: Arc<Notify>,
    ) -> Subscription {
        Subscription {
            hub,
            channel,
            name,
            entry,
            wake,
            holding_wake: false,
            owes_wake: false,
            needed: true,
        }
    }

    /// This waiter joined before its first attempt: it needs the channel only once it
    /// sleeps on it (see [`Subscription::needed`]).
    pub(crate) fn early(mut self) -> Subscription {
        self.needed = false;
        self
    }

    /// Whether this waiter was woken by the end of another client's turn rather than a
    /// release: that client may hold the lock, so a cheap look comes before an attempt.
    pub(crate) fn woken_by_lapse(&self) -> bool {
        self.entry.lapsed()
    }

    /// Whether Redis has confirmed the subscription: from now on, every release on the
    /// channel reaches this waiter.
    pub(crate) fn confirmed(&self) -> bool {
        self.entry.ready.load(Ordering::SeqCst)
    }

    /// Waits until Redis confirmed the subscription, at most `limit`. Returns whether it
    /// is confirmed.
    pub(crate) async fn ready(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let changed = self.entry.ready_changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if self.entry.ready.load(Ordering::SeqCst) {
                    return;
                }
                changed.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }

    /// Waits for an unlock message, at most `limit`. Returns whether one came.
    pub(crate) async fn woken(&mut self, limit: Duration) -> bool {
        self.needed = true;
        self.holding_wake = false;
        let got = tokio::time::timeout(limit, self.wake.notified())
            .await
            .is_ok();
        self.holding_wake = got;
        if got {
            self.hub.stats.count(Event::Woken);
        }
        got
    }

    /// The wake-up this waiter consumed was used (it took the lock, or saw it taken by
    /// another client, which will publish again on release).
    pub(crate) fn wake_used(&mut self) {
        self.holding_wake = false;
        self.owes_wake = false;
    }

    /// The wake-up this waiter consumed found the lock free but another client's turn:
    /// the waiter sleeps until the turn ends, and if it leaves before then (out of time,
    /// cancelled), another waiter of its name is woken in its place. The release that
    /// woke it may have been of the other name on the channel (`a` and `{a}`), which
    /// ended the lapse that would have woken the others when the turn runs out
    /// (`tests/adv_layout_paths.rs`, finding 4).
    pub(crate) fn wake_passed_over(&mut self) {
        self.owes_wake |= self.holding_wake;
        self.holding_wake = false;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.holding_wake || self.owes_wake {
            self.wake.notify_one();
        }
        self.entry.leave(&self.name);
        if self.needed {
            *self.entry.needed_at.lock() = Instant::now();
        }
        let mut channels = self.hub.channels.lock();
        if self.entry.waiters.fetch_sub(1, Ordering::SeqCst) == 1 {
            if self.entry.turns {
                // Kept for a while: this client's next wait on the lock is likely soon.
                let since = *self.entry.needed_at.lock();
                if !self.entry.linger_pending.swap(true, Ordering::SeqCst) {
                    self.hub
                        .timers
                        .lock()
                        .push((since + timers::LINGER, Timer::Linger(self.channel.clone())));
                    let _ = self.hub.commands.send(Command::Recheck);
                }
                return;
            }
            if matches!(channels.get(&self.channel), Some(e) if Arc::ptr_eq(e, &self.entry)) {
                channels.remove(&self.channel);
            }
            let _ = self
                .hub
                .commands
                .send(Command::Unsubscribe(self.channel.clone()));
        }
    }
}
