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
mod listener;
mod subscription;
mod timers;

use actor::actor;
pub(crate) use subscription::Subscription;
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
                let name = config.connection_name();
                background.service(runtime, actor(weak, source, rx, timeouts, name));
            }
            #[cfg(feature = "sentinel")]
            Deployment::Sentinel { .. } => {
                let sentinel = conn
                    .sentinel()
                    .expect("a Sentinel deployment has a Sentinel connection");
                let source = Source::Sentinel(sentinel);
                let name = config.connection_name();
                background.service(runtime, actor(weak, source, rx, timeouts, name));
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
        Subscription::new(
            self.shared.clone(),
            channel.clone(),
            name.clone(),
            entry,
            wake,
        )
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
