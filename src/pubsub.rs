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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Notify};

use crate::background::Background;
use crate::config::{Config, Deployment};
use crate::connection::{cluster_client, open_client, Conn, SentinelMaster};
use crate::error::Result;

/// Shared state of one channel's local waiters.
pub(crate) struct ChannelEntry {
    id: u64,
    waiters: AtomicU64,
    /// One wake-up queue per lock name. Names such as `coll` and `{coll}` share a channel
    /// (Redisson's layout), and the unlock message does not say which was released, so a
    /// message wakes one waiter of each name: the one whose lock it was then always
    /// hears of it, and a message nobody's unlock sent costs one attempt per name.
    names: Mutex<HashMap<Arc<str>, NameWaiters>>,
    /// True once Redis confirmed the SUBSCRIBE for this entry.
    ready: AtomicBool,
    ready_changed: Notify,
}

/// How many local waiters a lock name has on a channel, and their wake-up queue.
type NameWaiters = (usize, Arc<Notify>);

impl ChannelEntry {
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
        for (_, wake) in self.names.lock().values() {
            wake.notify_waiters();
            wake.notify_one();
        }
    }

    /// Every waiter sleeping now tries (the subscription broke).
    pub(crate) fn interrupt(&self) {
        for (_, wake) in self.names.lock().values() {
            wake.notify_waiters();
        }
    }
}

mod cluster;

/// How a cluster hub subscribes.
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
}

struct HubShared {
    channels: Mutex<HashMap<Arc<str>, Arc<ChannelEntry>>>,
    commands: mpsc::UnboundedSender<Command>,
    next_id: AtomicU64,
    connected: AtomicBool,
}

/// The per-client pub/sub hub.
pub(crate) struct PubSubHub {
    shared: Arc<HubShared>,
}

/// Where the subscriber connection of a single server or Sentinel deployment goes.
enum Source {
    Fixed(Box<redis::Client>),
    /// The master the sentinels name now; the hub moves when it changes.
    Sentinel(Arc<SentinelMaster>),
}

impl Source {
    fn client(&self) -> redis::Client {
        match self {
            Source::Fixed(c) => (**c).clone(),
            Source::Sentinel(s) => s.master_client(),
        }
    }
}

impl PubSubHub {
    pub(crate) async fn start(
        deployment: &Deployment,
        conn: &Conn,
        config: &Config,
        runtime: &Handle,
        background: &Background,
    ) -> Result<PubSubHub> {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(HubShared {
            channels: Mutex::new(HashMap::new()),
            commands: tx,
            next_id: AtomicU64::new(1),
            connected: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&shared);
        let timeouts = (config.connect_timeout, config.response_timeout);
        match deployment {
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
                    crate::pubsub::cluster::actor(weak, client, push_rx, rx, mode, timeouts),
                );
            }
            Deployment::Single { url } => {
                let source = Source::Fixed(Box::new(open_client(url, &config.tls)?));
                background.service(runtime, actor(weak, source, rx, timeouts.0, timeouts.1));
            }
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
    /// this is its first waiter.
    pub(crate) fn subscribe(&self, channel: &Arc<str>, name: &Arc<str>) -> Subscription {
        let mut channels = self.shared.channels.lock();
        let entry = channels
            .entry(channel.clone())
            .or_insert_with(|| {
                let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
                let _ = self
                    .shared
                    .commands
                    .send(Command::Subscribe(channel.clone(), id));
                Arc::new(ChannelEntry {
                    id,
                    waiters: AtomicU64::new(0),
                    names: Mutex::new(HashMap::new()),
                    ready: AtomicBool::new(false),
                    ready_changed: Notify::new(),
                })
            })
            .clone();
        entry.waiters.fetch_add(1, Ordering::SeqCst);
        let wake = entry.join(name);
        Subscription {
            hub: self.shared.clone(),
            channel: channel.clone(),
            name: name.clone(),
            entry,
            wake,
            holding_wake: false,
        }
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
}

impl Subscription {
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
        self.holding_wake = false;
        let got = tokio::time::timeout(limit, self.wake.notified())
            .await
            .is_ok();
        self.holding_wake = got;
        got
    }

    /// The wake-up this waiter consumed was used (it took the lock, or saw it taken by
    /// another client, which will publish again on release).
    pub(crate) fn wake_used(&mut self) {
        self.holding_wake = false;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.holding_wake {
            self.wake.notify_one();
        }
        self.entry.leave(&self.name);
        let mut channels = self.hub.channels.lock();
        if self.entry.waiters.fetch_sub(1, Ordering::SeqCst) == 1 {
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

/// The actor that owns the subscriber connection.
async fn actor(
    weak: Weak<HubShared>,
    source: Source,
    mut rx: mpsc::UnboundedReceiver<Command>,
    connect_timeout: Duration,
    response_timeout: Duration,
) {
    let mut backoff = Duration::from_millis(20);
    // Wait for the first waiter before opening a connection at all.
    let mut pending: Vec<Command> = match rx.recv().await {
        Some(c) => vec![c],
        None => return,
    };
    loop {
        // With nobody waiting there is nothing to reconnect for: wait for the next waiter.
        let idle =
            pending.is_empty() && weak.upgrade().is_none_or(|s| s.channels.lock().is_empty());
        if idle {
            match rx.recv().await {
                Some(c) => pending.push(c),
                None => return,
            }
        }
        let mut master_changed = match &source {
            Source::Sentinel(s) => Some(s.generation()),
            Source::Fixed(_) => None,
        };
        let client = source.client();
        let conn = tokio::time::timeout(connect_timeout, client.get_async_pubsub()).await;
        let pubsub = match conn {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "pub/sub connect failed; waiters fall back to TTL-bounded waits");
                if !sleep_draining(&mut rx, &mut pending, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
            Err(_) => {
                tracing::warn!("pub/sub connect timed out");
                if !sleep_draining(&mut rx, &mut pending, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let (mut sink, mut stream) = pubsub.split();
        let mut subscribed: HashSet<Arc<str>> = HashSet::new();
        let Some(shared) = weak.upgrade() else { return };

        // Subscribe everything that has waiters now; queued commands are covered by this.
        pending.clear();
        let wanted: Vec<Arc<str>> = shared.channels.lock().keys().cloned().collect();
        let resubscribed = if wanted.is_empty() {
            Ok(())
        } else {
            let names: Vec<&str> = wanted.iter().map(|c| &**c).collect();
            timed(response_timeout, sink.subscribe(names)).await
        };
        if let Err(e) = resubscribed {
            tracing::warn!(error = %e, "pub/sub resubscribe failed");
            drop(shared);
            if !sleep_draining(&mut rx, &mut pending, backoff).await {
                return;
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
            continue;
        }
        subscribed.extend(wanted);
        backoff = Duration::from_millis(20);
        shared.connected.store(true, Ordering::SeqCst);
        {
            let channels = shared.channels.lock();
            for (name, entry) in channels.iter() {
                if subscribed.contains(name) {
                    entry.ready.store(true, Ordering::SeqCst);
                    entry.ready_changed.notify_waiters();
                }
                // Anything may have been released while we were not listening.
                entry.wake_all();
            }
        }
        tracing::debug!(channels = subscribed.len(), "pub/sub connected");
        drop(shared);

        // Serve until the connection breaks.
        let broken = loop {
            tokio::select! {
                cmd = rx.recv() => {
                    let Some(cmd) = cmd else { return };
                    let batch = with_queued(cmd, &mut rx);
                    let Some(shared) = weak.upgrade() else { return };
                    if let Err(e) = reconcile(&shared, &mut sink, &mut subscribed, batch, response_timeout).await {
                        break e;
                    }
                }
                _ = changed(&mut master_changed) => {
                    break "the sentinels named another master".to_string();
                }
                msg = stream.next() => {
                    let Some(msg) = msg else { break "connection closed".to_string() };
                    let Some(shared) = weak.upgrade() else { return };
                    shared.deliver(msg.get_channel_name().as_bytes());
                }
            }
        };
        tracing::warn!(reason = %broken, "pub/sub connection lost; reconnecting");
        let Some(shared) = weak.upgrade() else { return };
        shared.disconnected();
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

    /// An unlock message arrived on `channel`.
    fn deliver(&self, channel: &[u8]) {
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        let entry = self.channels.lock().get(channel).cloned();
        if let Some(entry) = entry {
            // The payload is not looked at: Redisson's lock sends "0", its read-write
            // lock "1" (to a lock without readers, just a release), and anything else
            // was sent by no unlock but costs one attempt per name at most.
            entry.wake_each_name();
        }
    }
}

/// `first` and every command queued behind it, so one round trip serves them all.
fn with_queued(first: Command, rx: &mut mpsc::UnboundedReceiver<Command>) -> Vec<Command> {
    let mut batch = vec![first];
    while let Ok(more) = rx.try_recv() {
        batch.push(more);
    }
    batch
}

/// Completes when the watched master changes; never without a watch.
async fn changed(watch: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    match watch {
        Some(w) => {
            if w.changed().await.is_err() {
                std::future::pending::<()>().await
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// Applies queued commands: subscribe what has waiters, unsubscribe what has none.
async fn reconcile(
    shared: &HubShared,
    sink: &mut redis::aio::PubSubSink,
    subscribed: &mut HashSet<Arc<str>>,
    batch: Vec<Command>,
    response_timeout: Duration,
) -> Result<(), String> {
    let mut to_sub: Vec<Arc<str>> = Vec::new();
    let mut to_unsub: Vec<Arc<str>> = Vec::new();
    let mut confirm: Vec<(Arc<str>, u64)> = Vec::new();
    {
        let channels = shared.channels.lock();
        for cmd in batch {
            match cmd {
                Command::Subscribe(ch, id) => {
                    if channels.get(&ch).is_some_and(|e| e.id == id) {
                        if !subscribed.contains(&ch) && !to_sub.contains(&ch) {
                            to_sub.push(ch.clone());
                        }
                        confirm.push((ch, id));
                    }
                }
                Command::Unsubscribe(ch) => {
                    if !channels.contains_key(&ch)
                        && subscribed.contains(&ch)
                        && !to_unsub.contains(&ch)
                    {
                        to_unsub.push(ch);
                    }
                }
            }
        }
    }
    if !to_unsub.is_empty() {
        let names: Vec<&str> = to_unsub.iter().map(|c| &**c).collect();
        timed(response_timeout, sink.unsubscribe(names)).await?;
        for ch in &to_unsub {
            subscribed.remove(ch);
        }
    }
    if !to_sub.is_empty() {
        let names: Vec<&str> = to_sub.iter().map(|c| &**c).collect();
        timed(response_timeout, sink.subscribe(names)).await?;
        subscribed.extend(to_sub);
    }
    let channels = shared.channels.lock();
    for (ch, id) in confirm {
        if let Some(entry) = channels.get(&ch).filter(|e| e.id == id) {
            entry.ready.store(true, Ordering::SeqCst);
            entry.ready_changed.notify_waiters();
        }
    }
    Ok(())
}

async fn timed<F>(limit: Duration, fut: F) -> Result<(), String>
where
    F: std::future::Future<Output = redis::RedisResult<()>>,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

/// Sleeps `d` while keeping the command queue drained. Returns false when the hub is gone.
async fn sleep_draining(
    rx: &mut mpsc::UnboundedReceiver<Command>,
    pending: &mut Vec<Command>,
    d: Duration,
) -> bool {
    let sleep = tokio::time::sleep(d);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => return true,
            cmd = rx.recv() => match cmd {
                Some(c) => pending.push(c),
                None => return false,
            }
        }
    }
}
