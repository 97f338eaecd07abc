//! What the hub does later, on its actor's clock: wake the waiters of a channel whose
//! turn (`docs/protocol.md` 2.6) went to another client that never took the lock, and
//! unsubscribe a lock channel that stayed without waiters for [`LINGER`].

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::{ChannelEntry, HubShared};

/// How long a lock channel stays subscribed after its last waiter left. A client whose
/// tasks take a contended lock one after another would otherwise unsubscribe each time
/// its only waiter wins, and subscribe again (a round trip before its next wait) at once.
pub(crate) const LINGER: Duration = Duration::from_millis(200);

/// How long a client whose turn came with a subscriber outside the line (a Redisson
/// waiter, which the line cannot hold) lets that subscriber try first: the release sets
/// such a turn this much past its window, and the turn's own client is answered busy
/// until only the window is left (`lua/published.lua`'s `YIELD_MS`, the same; 1 to 2 ms
/// of real time there, as Redis counts whole ms). Redisson's waiter acts on the same
/// unlock message: a loopback or LAN round trip is well within it, and the actor's
/// timers tick in milliseconds.
pub(crate) const YIELD: Duration = Duration::from_millis(2);

pub(super) enum Timer {
    /// The turn announced as `gen` ran out: unless the channel heard of its use since,
    /// the lock may be free with nobody told.
    Lapse(Weak<ChannelEntry>, u64),
    /// The channel lost its last waiter at the time set; unsubscribe if it still has none.
    Linger(Arc<str>),
    /// The unlock message counted as `wakes`, held back for [`YIELD`]: wake the waiters,
    /// unless a later release or lapse woke them since. Another client's turn announced
    /// meanwhile does not void it: the unlock message behind that turn wakes nobody here,
    /// and the waiter, out of the line since its turn, would otherwise sleep until its
    /// last busy answer's PTTL (`adv_intent::a_yield_voided_by_another_turn_still_wakes_the_waiter`).
    Yield(Weak<ChannelEntry>, u64),
}

/// Whose turn a channel's last turn message named, and whether the unlock message right
/// behind it is to be let pass without waking anyone here.
#[derive(Default)]
pub(super) struct TurnState {
    /// Until when the next unlock message belongs to another client's turn. Set by a
    /// turn message, which the unlock message follows at once on the same connection;
    /// bounded so that a turn message whose unlock message never came (refused by ACL)
    /// cannot hold back a later one.
    suppress_until: Option<Instant>,
    /// Counts turn messages and releases: a lapse timer whose count moved on is void.
    gen: u64,
    /// Another client's turn was announced, and no release since: a lapse timer will
    /// wake the waiters when it ends.
    lapse_pending: bool,
    /// The last wake-up on the channel was a turn's end, not a release: the turn may have
    /// been used, so a waiter it woke asks whether the lock is held before it tries.
    lapsed: bool,
    /// The last turn message gave this client the turn and asked it to yield first: the
    /// unlock message behind it wakes its waiters [`YIELD`] late.
    yield_first: bool,
    /// Counts the wake-ups a release or a lapse gave (turn messages do not): a yield
    /// timer whose count moved on is void.
    wakes: u64,
    /// The yield this client owes now: until when, and at which count of wake-ups it
    /// was armed. Any attempt of the client waits for it, not only the waiters the
    /// unlock message would have woken: one woken at the same moment by the end of the
    /// turn before (its lapse, or its sleep's bound) would otherwise take the lock
    /// first.
    yielding: Option<(Instant, u64)>,
}

impl ChannelEntry {
    /// Whether the last wake-up on the channel was the end of another client's turn
    /// (see [`TurnState::lapsed`]).
    pub(super) fn lapsed(&self) -> bool {
        self.turn.lock().lapsed
    }

    /// Waiters are woken for another reason than a turn's end (a reconnect).
    pub(super) fn clear_lapse(&self) {
        self.turn.lock().lapsed = false;
    }
}

impl HubShared {
    /// A turn message on a lock's channel: the turn of the client numbered `client`
    /// has begun.
    pub(super) fn on_turn(&self, entry: &Arc<ChannelEntry>, client: u64, yields: bool) {
        let mut t = entry.turn.lock();
        t.gen += 1;
        t.lapsed = false;
        t.yield_first = false;
        if Some(client) == self.me {
            t.suppress_until = None;
            t.lapse_pending = false;
            t.yield_first = yields;
            return;
        }
        let now = Instant::now();
        t.suppress_until = Some(now + self.turn_window);
        t.lapse_pending = true;
        let gen = t.gen;
        drop(t);
        // A little past the turn's end in Redis, which began before the message left;
        // a turn that yields first lasts `YIELD` longer there (`lua/published.lua`).
        let length = match yields {
            true => self.turn_window + YIELD,
            false => self.turn_window,
        };
        let lapse = now + length + Duration::from_millis(1);
        self.timers
            .lock()
            .push((lapse, Timer::Lapse(Arc::downgrade(entry), gen)));
    }

    /// An unlock message on a lock's channel: whether it follows another client's turn
    /// message (and so wakes nobody here). Otherwise it is a release after any turn
    /// announced before, which has ended: no lapse timer need wake the waiters again.
    pub(super) fn for_another_turn(&self, entry: &ChannelEntry) -> bool {
        let mut t = entry.turn.lock();
        let another = match t.suppress_until.take() {
            Some(until) => Instant::now() < until,
            None => false,
        };
        if !another {
            t.gen += 1;
            t.wakes += 1;
            t.lapse_pending = false;
            t.lapsed = false;
        }
        another
    }

    /// An unlock message behind this client's own turn, which asked it to yield first:
    /// its waiters are woken [`YIELD`] late, by a timer. Whether it was.
    pub(super) fn yield_first(&self, entry: &Arc<ChannelEntry>) -> bool {
        let mut t = entry.turn.lock();
        if !std::mem::take(&mut t.yield_first) {
            return false;
        }
        let wakes = t.wakes;
        let at = Instant::now() + YIELD;
        t.yielding = Some((at, wakes));
        drop(t);
        self.yields_pending.fetch_add(1, Ordering::SeqCst);
        self.timers
            .lock()
            .push((at, Timer::Yield(Arc::downgrade(entry), wakes)));
        true
    }

    /// Until when this client yields `channel`'s lock to a subscriber outside the line
    /// (see [`TurnState::yielding`]); `None` once a later release or lapse woke the
    /// waiters, or the yield is over.
    pub(super) fn yielding(&self, channel: &str) -> Option<Instant> {
        if self.yields_pending.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let entry = self.channels.lock().get(channel).cloned()?;
        let t = entry.turn.lock();
        let (until, wakes) = t.yielding?;
        (wakes == t.wakes && Instant::now() < until).then_some(until)
    }

    /// Whether `channel`'s hub heard another client's turn announced and will wake its
    /// waiters if that turn runs out unused.
    pub(super) fn turn_covered(&self, channel: &str) -> bool {
        let entry = self.channels.lock().get(channel).cloned();
        entry.is_some_and(|e| e.turn.lock().lapse_pending)
    }

    /// When the actor should next call [`fire`](Self::fire).
    pub(super) fn next_timer(&self) -> Option<Instant> {
        self.timers.lock().iter().map(|(at, _)| *at).min()
    }

    /// Runs the timers that are due; returns the channels to unsubscribe.
    pub(super) fn fire(&self) -> Vec<Arc<str>> {
        let now = Instant::now();
        let due: Vec<Timer> = {
            let mut timers = self.timers.lock();
            let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut *timers)
                .into_iter()
                .partition(|(at, _)| *at <= now);
            *timers = rest;
            due.into_iter().map(|(_, t)| t).collect()
        };
        let mut unsubscribe = Vec::new();
        for timer in due {
            match timer {
                Timer::Lapse(entry, gen) => {
                    if let Some(entry) = entry.upgrade() {
                        let mut t = entry.turn.lock();
                        if t.gen == gen {
                            t.wakes += 1;
                            t.lapse_pending = false;
                            t.lapsed = true;
                            drop(t);
                            entry.wake_each_name();
                        }
                    }
                }
                Timer::Yield(entry, wakes) => {
                    self.yields_pending.fetch_sub(1, Ordering::SeqCst);
                    let Some(entry) = entry.upgrade() else {
                        continue;
                    };
                    let current = entry.turn.lock().wakes == wakes;
                    if current {
                        entry.wake_each_name();
                    }
                }
                Timer::Linger(channel) => {
                    let mut channels = self.channels.lock();
                    let Some(entry) = channels.get(&channel).cloned() else {
                        continue;
                    };
                    let since = *entry.needed_at.lock();
                    match entry.waiters() {
                        0 if now >= since + LINGER => {
                            channels.remove(&channel);
                            unsubscribe.push(channel);
                        }
                        // Needed again since: it lingers from then.
                        0 => {
                            self.timers
                                .lock()
                                .push((since + LINGER, Timer::Linger(channel)));
                        }
                        // In use: its last waiter to leave sets a timer again.
                        _ => entry.linger_pending.store(false, Ordering::SeqCst),
                    }
                }
            }
        }
        unsubscribe
    }
}
