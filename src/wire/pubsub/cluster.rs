//! The hub's actor on a Redis Cluster.
//!
//! It uses redis-rs's cluster connection in RESP3 mode, whose pushes (messages and
//! subscription changes) arrive on a channel. Sharded channels are subscribed one by
//! one, since `SSUBSCRIBE` of channels in different slots is refused, and the cluster
//! connection sends each to the node that owns the channel's slot.
//!
//! Failover is the case to get right. The old owner of a slot tells its shard
//! subscribers `sunsubscribe` when it loses the slot; a killed node just disconnects.
//! Either way every affected channel that still has waiters is subscribed again, and
//! its waiters are woken to try the lock once more, since an unlock may have been
//! published where nobody listened.
//!
//! A subscription made again must land at the new owner, and no `MOVED` sees to that:
//! Redis 7 serves `SSUBSCRIBE` at a replica of the slot's owner too, and the master a
//! manual failover demoted is one, still named by the connection's slot map. There the
//! subscription is accepted, but the new owner forwards published messages only to
//! the replicas it knows of, and it learns of this one by gossip, up to half the node
//! timeout later: an unlock published meanwhile never arrives, and its waiters sleep out
//! the holder's lease. So before subscribing again the hub checks that the node its
//! connection routes the channel to is a master, and if it is not, makes the
//! connection refresh its slot map with a keyed read, which a replica does answer with
//! `MOVED`.
//!
//! Its node connections are named (`docs/protocol.md` 1.6) when it connects. After a node
//! connection drops, redis-rs opens the new one with no name: the nodes where channels are
//! subscribed again are named once more, after their waiters are woken, and again
//! [`RENAME_AGAIN`] later (the connection that took the subscription may be replaced just
//! then). Only those: a
//! `CLIENT SETNAME` to every node also goes to the one that is down, and so tried, it held
//! resubscription after a master kill up past 5 s in 2 runs of 7 (a failed request can
//! make redis-rs rebuild its slot map, and every request on the connection waits for it).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc;

use super::actor::{sleep_draining, until, with_queued};
use super::{Command, HubShared, Mode};
use crate::wire::connection::{connect_cluster, setname};
use crate::wire::slot::key_slot;

/// How long after naming the nodes of a reconnect they are named once more: redis-rs may
/// still replace the node connection that took the subscription just then, and the one
/// it keeps came up with no name (`client_name::cluster_node_connections_are_named`
/// failed about 1 run in 10 with one naming). `CLIENT SETNAME` again is harmless.
const RENAME_AGAIN: Duration = Duration::from_millis(250);

pub(super) async fn actor(
    weak: Weak<HubShared>,
    client: redis::cluster::ClusterClient,
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    mut rx: mpsc::UnboundedReceiver<Command>,
    mode: Mode,
    (connect_timeout, response_timeout): (Duration, Duration),
    name: String,
) {
    let mut pending: Vec<Command> = match rx.recv().await {
        Some(c) => vec![c],
        None => return,
    };
    let mut backoff = Duration::from_millis(20);
    let conn = loop {
        match tokio::time::timeout(connect_timeout, connect_cluster(&client, &name)).await {
            Ok(Ok(c)) => break c,
            Ok(Err(e)) => tracing::warn!(error = %e, "cluster pub/sub connect failed"),
            Err(_) => tracing::warn!("cluster pub/sub connect timed out"),
        }
        if !sleep_draining(&mut rx, &mut pending, backoff).await {
            return;
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    };
    let mut hub = ClusterHub {
        conn,
        mode,
        subscribed: HashSet::new(),
        retry: HashSet::new(),
        response_timeout,
        name,
        unnamed: false,
        rename: HashSet::new(),
    };
    if let Some(shared) = weak.upgrade() {
        shared.connected.store(true, Ordering::SeqCst);
        shared.stats.count(crate::stats::Event::PubsubConnected);
        hub.apply(&shared, std::mem::take(&mut pending)).await;
    }
    let mut retry_timer = Box::pin(tokio::time::sleep(Duration::from_secs(3600)));
    let mut rename_timer = Box::pin(tokio::time::sleep(Duration::from_secs(3600)));
    loop {
        let next = weak.upgrade().and_then(|s| s.next_timer());
        tokio::select! {
            _ = until(next) => {
                let Some(shared) = weak.upgrade() else { return };
                let batch = shared.fire().into_iter().map(Command::Unsubscribe).collect();
                hub.apply(&shared, batch).await;
            }
            cmd = rx.recv() => {
                let Some(cmd) = cmd else { return };
                let batch = with_queued(cmd, &mut rx);
                let Some(shared) = weak.upgrade() else { return };
                hub.apply(&shared, batch).await;
            }
            push = pushes.recv() => {
                let Some(push) = push else { return };
                let Some(shared) = weak.upgrade() else { return };
                hub.on_push(&shared, push);
            }
            _ = &mut retry_timer, if !hub.retry.is_empty() => {}
            _ = &mut rename_timer, if !hub.rename.is_empty() => {
                let slots = std::mem::take(&mut hub.rename);
                hub.name_nodes(slots).await;
            }
        }
        if !hub.retry.is_empty() {
            let Some(shared) = weak.upgrade() else { return };
            hub.resubscribe(&shared).await;
            if !hub.rename.is_empty() {
                rename_timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + RENAME_AGAIN);
            }
            if !hub.retry.is_empty() {
                retry_timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + Duration::from_millis(100));
            }
        }
    }
}

struct ClusterHub {
    conn: ClusterConnection,
    mode: Mode,
    /// Channels Redis confirmed.
    subscribed: HashSet<Arc<str>>,
    /// Channels with waiters whose subscription was lost and must be made again.
    retry: HashSet<Arc<str>>,
    response_timeout: Duration,
    /// What the node connections are named.
    name: String,
    /// A node connection dropped: the nodes of the channels subscribed again are to be
    /// named (see the module docs).
    unnamed: bool,
    /// Slots whose masters were named after a reconnect, to be named once more
    /// [`RENAME_AGAIN`] later.
    rename: HashSet<u16>,
}

impl ClusterHub {
    /// Names the masters of `slots` (where their channels were just subscribed, so they
    /// answer), all at once, within one response timeout.
    async fn name_nodes(&self, slots: HashSet<u16>) {
        let named = slots.into_iter().map(|slot| {
            let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
            let mut conn = self.conn.clone();
            let setname = setname(&self.name);
            async move {
                let reply = conn
                    .route_command(setname, RoutingInfo::SingleNode(route))
                    .await;
                if let Err(e) = reply.and_then(|v| v.extract_error()) {
                    tracing::debug!(error = %e, slot, "CLIENT SETNAME failed; the connection stays unnamed");
                }
            }
        });
        let all = futures_util::future::join_all(named);
        let _ = tokio::time::timeout(self.response_timeout, all).await;
    }

    async fn subscribe(&mut self, channel: &str) -> Result<(), String> {
        let (mut conn, mode) = (self.conn.clone(), self.mode);
        let fut = async move {
            match mode {
                Mode::Sharded => conn.ssubscribe(channel).await,
                Mode::Classic => conn.subscribe(channel).await,
            }
        };
        match tokio::time::timeout(self.response_timeout, fut).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer".into()),
        }
    }

    /// Whether the connection routes `channel` to a master (see the module docs), after
    /// making it refresh its slot map if it did not. When the node cannot be asked, the
    /// answer is yes: subscribing then fails or lands as it would have without the check.
    async fn routed_to_master(&mut self, channel: &str) -> bool {
        let slot = key_slot(channel.as_bytes());
        for attempt in 0..2 {
            // SSUBSCRIBE is routed to the slot's master entry, as this is.
            let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
            let mut conn = self.conn.clone();
            let role = conn.route_command(redis::cmd("ROLE"), RoutingInfo::SingleNode(route));
            match tokio::time::timeout(self.response_timeout, role).await {
                Ok(Ok(reply)) if is_replica(&reply) => {}
                _ => return true,
            }
            if attempt == 0 {
                // Any keyed read will do; the channel name is a key of the same slot.
                let probe = redis::cmd("EXISTS").arg(channel).clone();
                let mut conn = self.conn.clone();
                let _ =
                    tokio::time::timeout(self.response_timeout, conn.req_packed_command(&probe))
                        .await;
            }
        }
        false
    }

    async fn unsubscribe(&mut self, channel: &str) {
        let (mut conn, mode) = (self.conn.clone(), self.mode);
        let fut = async move {
            match mode {
                Mode::Sharded => conn.sunsubscribe(channel).await,
                Mode::Classic => conn.unsubscribe(channel).await,
            }
        };
        // A failed unsubscribe costs only stray messages, which find no entry.
        let _ = tokio::time::timeout(self.response_timeout, fut).await;
    }

    async fn apply(&mut self, shared: &HubShared, batch: Vec<Command>) {
        let mut to_sub: Vec<(Arc<str>, u64)> = Vec::new();
        let mut to_unsub: Vec<Arc<str>> = Vec::new();
        {
            let channels = shared.channels.lock();
            for cmd in batch {
                match cmd {
                    Command::Subscribe(ch, id) => {
                        if channels.get(&ch).is_some_and(|e| e.id == id) {
                            to_sub.push((ch, id));
                        }
                    }
                    Command::Unsubscribe(ch) => {
                        if !channels.contains_key(&ch) && self.subscribed.contains(&ch) {
                            to_unsub.push(ch);
                        }
                    }
                    Command::Recheck => {}
                }
            }
        }
        for ch in to_unsub {
            self.subscribed.remove(&ch);
            self.retry.remove(&ch);
            self.unsubscribe(&ch).await;
        }
        for (ch, id) in to_sub {
            if self.retry.contains(&ch) {
                // `resubscribe` makes it, after checking where it would land.
                continue;
            }
            if !self.subscribed.contains(&ch) {
                match self.subscribe(&ch).await {
                    Ok(()) => {
                        self.subscribed.insert(ch.clone());
                    }
                    Err(e) => {
                        tracing::warn!(channel = %ch, error = %e, "cluster subscribe failed; retrying");
                        self.retry.insert(ch.clone());
                        continue;
                    }
                }
            }
            if let Some(entry) = shared.channels.lock().get(&ch).filter(|e| e.id == id) {
                entry.confirmed();
            }
        }
    }

    fn on_push(&mut self, shared: &HubShared, push: PushInfo) {
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(Value::BulkString(ch)) = push.data.first() {
                    let payload = match push.data.get(1) {
                        Some(Value::BulkString(p)) => p.as_slice(),
                        _ => &[],
                    };
                    shared.deliver(ch, payload);
                }
            }
            PushKind::SUnsubscribe | PushKind::Unsubscribe => {
                // Ours are for channels without waiters; one for a channel that still
                // has waiters comes from a node that gave its slot away.
                let Some(Value::BulkString(ch)) = push.data.first() else {
                    return;
                };
                let Ok(ch) = std::str::from_utf8(ch) else {
                    return;
                };
                let entry = shared.channels.lock().get(ch).cloned();
                if let Some(entry) = entry {
                    tracing::info!(channel = %ch, "subscription dropped by the server; subscribing again");
                    let ch: Arc<str> = ch.into();
                    self.subscribed.remove(&ch);
                    self.retry.insert(ch);
                    entry.ready.store(false, Ordering::SeqCst);
                    entry.interrupt();
                }
            }
            PushKind::Disconnection => {
                // Which node went away is not said; subscribing again is idempotent.
                tracing::info!("a cluster pub/sub connection dropped; subscribing again");
                let wanted: Vec<Arc<str>> = shared.channels.lock().keys().cloned().collect();
                for ch in wanted {
                    self.subscribed.remove(&ch);
                    self.retry.insert(ch);
                }
                self.unnamed = true;
                shared.disconnected();
                shared.connected.store(true, Ordering::SeqCst);
                shared.stats.count(crate::stats::Event::PubsubConnected);
            }
            _ => {}
        }
    }

    async fn resubscribe(&mut self, shared: &HubShared) {
        let retry: Vec<Arc<str>> = self.retry.drain().collect();
        // Channels of one slot are routed alike: one check per slot and pass.
        let mut at_master: HashMap<u16, bool> = HashMap::new();
        let mut resubscribed: HashSet<u16> = HashSet::new();
        for ch in retry {
            let entry = shared.channels.lock().get(&ch).cloned();
            let Some(entry) = entry else { continue };
            if self.mode == Mode::Sharded {
                let slot = key_slot(ch.as_bytes());
                let ok = match at_master.get(&slot) {
                    Some(ok) => *ok,
                    None => {
                        let ok = self.routed_to_master(&ch).await;
                        at_master.insert(slot, ok);
                        ok
                    }
                };
                if !ok {
                    tracing::debug!(channel = %ch, "the slot's owner is not known yet; retrying");
                    self.retry.insert(ch);
                    continue;
                }
            }
            match self.subscribe(&ch).await {
                Ok(()) => {
                    self.subscribed.insert(ch.clone());
                    entry.confirmed();
                    // An unlock may have gone out while nobody listened.
                    entry.wake_all();
                    resubscribed.insert(key_slot(ch.as_bytes()));
                }
                Err(e) => {
                    tracing::debug!(channel = %ch, error = %e, "cluster resubscribe failed; retrying");
                    self.retry.insert(ch);
                }
            }
        }
        if self.unnamed {
            self.rename.extend(resubscribed.iter().copied());
            self.name_nodes(resubscribed).await;
            self.unnamed = !self.retry.is_empty();
        }
    }
}

/// Whether a `ROLE` reply is a replica's.
fn is_replica(role: &Value) -> bool {
    let Value::Array(items) = role else {
        return false;
    };
    match items.first() {
        Some(Value::BulkString(r)) => r == b"slave",
        Some(Value::SimpleString(r)) => r == "slave",
        _ => false,
    }
}
