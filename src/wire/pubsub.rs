//! Pub/sub waiters: one subscriber connection per client, shared by every waiter.
//!
//! Waiters on one channel share one [`ChannelEntry`]; the channel is subscribed while it
//! has at least one local waiter and unsubscribed when the last one leaves. A single actor
//! task owns the connection and reconciles what Redis is subscribed to with the entries
//! in the map, so subscribe and unsubscribe of the same channel can never be reordered.
//!
//! An unlock message wakes one local waiter of each lock name on the channel (names such
//! as `coll` and `{coll}` share one). A waiter that was woken but leaves without taking
//! the lock (cancelled, or out of time) passes the wake on to the next waiter of its
//! name, so the message is not lost for the waiters behind it. When the connection breaks,
//! the actor reconnects, subscribes again to every channel that still has waiters, and
//! wakes all of them to retry, since an unlock may have been published while it was down.
//! Waiters never depend on pub/sub alone: each wait is also bounded by the lock's TTL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use crate::background::Background;
use crate::config::{Config, Deployment};
use crate::error::Result;
use crate::hash::Seeded;
use crate::stats::{Counters, Event};
#[cfg(feature = "cluster")]
use crate::wire::connection::cluster_client;
#[cfg(feature = "sentinel")]
use crate::wire::connection::SentinelMaster;
use crate::wire::connection::{open_client, Conn};
use crate::wire::raw::TurnMessage;

/// Shared state of one channel's local waiters.
pub(crate) struct ChannelEntry {
    id: u64,
    waiters: AtomicU64,
    /// One wake-up queue per lock name. Names such as `coll` and `{coll}` share a channel
    /// (Redisson's layout), and the unlock message does not say which was released, so a
    /// message wakes one waiter of each name: the one whose lock it was then always
    /// hears of it, and a message nobody's unlock sent costs one attempt per name.
    names: Mutex<HashMap<Arc<str>, NameWaiters, Seeded>>,
    /// True once Redis confirmed the SUBSCRIBE for this entry.
    ready: AtomicBool,
    ready_changed: Notify,
    /// A plain lock's channel with turns on: turn messages come on it too
    /// (`docs/protocol.md` 2.6). Such a channel also lingers (see [`timers::LINGER`]).
    turns: bool,
    turn: Mutex<TurnState>,
    /// When a waiter last needed the channel (see [`Subscription::needed`]): a channel
    /// without waiters lingers from there, not from the last leave of a waiter that
    /// never needed it.
    needed_at: Mutex<Instant>,
    /// A linger timer is set for the entry.
    linger_pending: AtomicBool,
}

/// How many local waiters a lock name has on a channel, and their wake-up queue.
type NameWaiters = (usize, Arc<Notify>);

impl ChannelEntry {
    /// Redis confirmed the subscription of the entry's channel.
    fn confirmed(&self) {
        self.ready.store(true, Ordering::SeqCst);
        self.ready_changed.notify_waiters();
    }

    fn waiters(&self) -> u64 {
        self.waiters.load(Ordering::SeqCst)
    }

    fn join(&self, name: &Arc<str>) -> Arc<Notify> {
        let mut names = self.names.lock();
        let slot = names.entry(name.clone()).or_default();
        slot.0 += 1;
        slot.1.clone()
    }

    fn leave(&self, name: &Arc<str>) {
        let mut names = self.names.lock();
        if let Some(slot) = names.get_mut(name) {
            slot.0 -= 1;
            if slot.0 == 0 {
                names.remove(name);
            }
        }
    }

    /// An unlock message: one waiter of each name (or its next wait) tries.
    fn wake_each_name(&self) {
        for (_, wake) in self.names.lock().values() {
            wake.notify_one();
        }
    }

    /// Every waiter tries now, and the next one to wait of each name too: messages may
    /// have been missed while the channel was not subscribed.
    pub(crate) fn wake_all(&self) {
        self.clear_lapse();
        for (_, wake) in self.names.lock().values() {
            wake.notify_waiters();
            wake.notify_one();
        }
    }

    /// Every waiter sleeping now tries (the subscription broke).
    pub(crate) fn interrupt(&self) {
        self.clear_lapse();
        for (_, wake) in self.names.lock().values() {
            wake.notify_waiters();
        }
    }
}

mod actor;
#[cfg(feature = "cluster")]
mod cluster;
mod timers;

use actor::actor;
use timers::{Timer, TurnState};

/// How a cluster hub subscribes.
#[cfg(feature = "cluster")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `SSUBSCRIBE` at the node that owns the channel's slot.
    Sharded,
    /// `SUBSCRIBE` at any node: classic messages reach every node.
    Classic,
}

enum Command {
    /// The entry `id` of this channel wants the channel subscribed.
    Subscribe(Arc<str>, u64),
    /// The channel lost its last waiter.
    Unsubscribe(Arc<str>),
    /// A timer was set: the actor looks at when it is due.
    Recheck,
}

struct HubShared {
    channels: Mutex<HashMap<Arc<str>, Arc<ChannelEntry>, Seeded>>,
    commands: mpsc::UnboundedSender<Command>,
    next_id: AtomicU64,
    connected: AtomicBool,
    stats: Arc<Counters>,
    /// This client's number, as a turn message names it (`raw::turn_message`).
    me: Option<u64>,
    turn_window: Duration,
    timers: Mutex<Vec<(Instant, Timer)>>,
    /// Yield timers set and not yet run: while there are none, no call needs to look
    /// its channel up to know it need not hold back (every `lock()` asks).
    yields_pending: AtomicUsize,
}

/// The per-client pub/sub hub.
pub(crate) struct PubSubHub {
    shared: Arc<HubShared>,
}

/// Where the subscriber connection of a single server or Sentinel deployment goes.
enum Source {
    Fixed(Box<redis::Client>),
    /// The master the sentinels name now; the hub moves when it changes.
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<SentinelMaster>),
}

impl Source {
    fn client(&self) -> redis::Client {
        match self {
            Source::Fixed(c) => (**c).clone(),
            #[cfg(feature = "sentinel")]
            Source::Sentinel(s) => s.master_client(),
        }
    }
}

impl PubSubHub {
    #[cfg_attr(
        not(any(feature = "cluster", feature = "sentinel")),
        allow(unused_variables)
    )]
    pub(crate) async fn start(
        deployment: &Deployment,
        conn: &Conn,
        config: &Config,
        runtime: &Handle,
        background: &Background,
        stats: Arc<Counters>,
        me: Arc<str>,
    ) -> Result<PubSubHub> {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(HubShared {
            channels: Mutex::new(HashMap::default()),
            commands: tx,
            next_id: AtomicU64::new(1),
            connected: AtomicBool::new(false),
            stats,
            me: crate::wire::raw::TurnMessage::number_of(&me),
            turn_window: config.turn_window,
            timers: Mutex::new(Vec::new()),
            yields_pending: AtomicUsize::new(0),
        });
        let weak = Arc::downgrade(&shared);
        let timeouts = (config.connect_timeout, config.response_timeout);
        match deployment {
            #[cfg(feature = "cluster")]
            Deployment::Cluster { nodes } => {
                let (push_tx, push_rx) = mpsc::unbounded_channel();
                let client = cluster_client(nodes, config, Some(push_tx))?;
                let mode = if conn.sharded() {
                    Mode::Sharded
                } else {
                    Mode::Classic
                };
                background.service(
                    runtime,
                    crate::wire::pubsub::cluster::actor(
                        weak,
                        client,
                        push_rx,
                        rx,
                        mode,
                        timeouts,
                        config.connection_name(),
                    ),
                );
            }
            Deployment::Single { url } => {
                let client = match &config.redis_client {
                    Some(c) => c.clone(),
                    None => open_client(url, &config.tls)?,
                };
                let source = Source::Fixed(Box::new(client));
                background.service(runtime, actor(weak, source, rx, timeouts.0, timeouts.1));
            }
            #[cfg(feature = "sentinel")]
            Deployment::Sentinel { .. } => {
                let sentinel = conn
                    .sentinel()
                    .expect("a Sentinel deployment has a Sentinel connection");
                let source = Source::Sentinel(sentinel);
                background.service(runtime, actor(weak, source, rx, timeouts.0, timeouts.1));
            }
        }
        Ok(PubSubHub { shared })
    }

    /// Joins the waiters of `channel` for the lock `name`, subscribing the channel if
    /// this is its first waiter. `turns`: a plain lock's channel with turns on, where
    /// turn messages come too.
    pub(crate) fn subscribe(
        &self,
        channel: &Arc<str>,
        turns: bool,
        name: &Arc<str>,
    ) -> Subscription {
        let mut channels = self.shared.channels.lock();
        let entry = match channels.get(channel) {
            Some(e) => e.clone(),
            None => {
                let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
                let entry = Arc::new(ChannelEntry {
                    id,
                    waiters: AtomicU64::new(0),
                    names: Mutex::new(HashMap::default()),
                    ready: AtomicBool::new(false),
                    ready_changed: Notify::new(),
                    turns,
                    turn: Mutex::default(),
                    needed_at: Mutex::new(Instant::now()),
                    linger_pending: AtomicBool::new(false),
                });
                channels.insert(channel.clone(), entry.clone());
                let _ = self
                    .shared
                    .commands
                    .send(Command::Subscribe(channel.clone(), id));
                entry
            }
        };
        entry.waiters.fetch_add(1, Ordering::SeqCst);
        let wake = entry.join(name);
        Subscription {
            hub: self.shared.clone(),
            channel: channel.clone(),
            name: name.clone(),
            entry,
            wake,
            holding_wake: false,
            owes_wake: false,
            needed: true,
        }
    }

    /// Whether `channel` is subscribed and confirmed (it has waiters, or lingers): a
    /// waiter that joins it before its first attempt hears every release after it.
    pub(crate) fn is_ready(&self, channel: &str) -> bool {
        self.shared
            .channels
            .lock()
            .get(channel)
            .is_some_and(|e| e.ready.load(Ordering::SeqCst))
    }

    /// Whether the client listens on `channel`: subscribed, subscribing, or lingering
    /// after its last waiter (`docs/protocol.md` 2.6: a release counts it then).
    pub(crate) fn listens(&self, channel: &str) -> bool {
        self.shared.channels.lock().contains_key(channel)
    }

    /// See `HubShared::turn_covered`.
    pub(crate) fn turn_covered(&self, channel: &str) -> bool {
        self.shared.turn_covered(channel)
    }

    /// Until when this client lets a subscriber outside the line try `channel`'s lock
    /// first, after a turn message that asked it to (`docs/protocol.md` 2.6).
    pub(crate) fn yielding(&self, channel: &str) -> Option<Instant> {
        self.shared.yielding(channel)
    }

    /// Number of channels with local waiters.
    #[allow(dead_code)]
    pub(crate) fn channels(&self) -> usize {
        self.shared.channels.lock().len()
    }
}

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

impl HubShared {
    /// Every entry loses its confirmed subscription; waiters retry now rather than
    /// sleep through a message that will never come.
    fn disconnected(&self) {
        self.connected.store(false, Ordering::SeqCst);
        for entry in self.channels.lock().values() {
            entry.ready.store(false, Ordering::SeqCst);
            entry.interrupt();
        }
    }

    /// A message `payload` arrived on `channel`.
    fn deliver(&self, channel: &[u8], payload: &[u8]) {
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        let entry = self.channels.lock().get(channel).cloned();
        if let Some(entry) = entry {
            // Only a lock's channels carry turn messages and force-unlock events. A
            // semaphore's carries its new count, which may be any number: read as one of
            // those, a count of 2^48 - 1 to 2^49 - 1 would wake none of its waiters.
            let message = match crate::wire::raw::is_lock_channel(channel) {
                true => TurnMessage::of(payload),
                false => TurnMessage::Other,
            };
            match message {
                // A turn is only a hint (a client with turns off has no use for it), and
                // a force unlock's unlock message comes right behind its event.
                TurnMessage::Turn { client, yields } if entry.turns => {
                    return self.on_turn(&entry, client, yields)
                }
                TurnMessage::Turn { .. } | TurnMessage::ForceEvent => return,
                TurnMessage::Other => {}
            }
            // Redisson's lock sends "0": one waiter per name may go. On a read-write
            // lock's channel every waiter tries: after a writer's "1" readers share, and
            // after the last reader's "0" the waiting writer must hear it, though new
            // readers of this client, held back for it, would take a single wake-up.
            // Anything else was sent by no unlock but costs one attempt per name at most.
            // With turns, the unlock message right behind a turn message for another
            // client is that client's: waiters here would only be answered busy.
            if channel.starts_with(crate::wire::raw::RW_CHANNEL_PREFIX) {
                entry.wake_all();
            } else if self.for_another_turn(&entry) {
                self.stats.count(Event::TurnDeferred);
            } else if !self.yield_first(&entry) {
                entry.wake_each_name();
            }
        }
    }
}
