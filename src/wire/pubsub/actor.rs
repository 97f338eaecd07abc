//! The subscriber actor of a single server or a Sentinel deployment: one connection,
//! reconciled with the channels that have waiters, reconnected when it breaks.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;

use super::listener::{Listener, Wanted};
use super::{Command, HubShared, Source};

/// The actor that owns the subscriber connection.
pub(super) async fn actor(
    weak: Weak<HubShared>,
    source: Source,
    mut rx: mpsc::UnboundedReceiver<Command>,
    (connect_timeout, response_timeout): (Duration, Duration),
    name: String,
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
            #[cfg(feature = "sentinel")]
            Source::Sentinel(s) => Some(s.generation()),
            Source::Fixed(_) => None,
        };
        let client = source.client();
        let limits = (connect_timeout, response_timeout);
        let opened = Listener::open(&client, &name, limits).await;
        let mut listener = match opened {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "pub/sub connect failed; waiters fall back to TTL-bounded waits");
                if !sleep_draining(&mut rx, &mut pending, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        // Each subscribed channel, and whether it carries this client's mark.
        let mut subscribed: HashMap<Arc<str>, bool> = HashMap::new();
        let Some(shared) = weak.upgrade() else { return };

        // Subscribe everything that has waiters now; queued commands are covered by this.
        pending.clear();
        let wanted: Vec<Wanted> = shared
            .channels
            .lock()
            .iter()
            .map(|(ch, e)| (ch.clone(), e.turns))
            .collect();
        let resubscribed =
            subscribe(&mut listener, &mut subscribed, wanted, response_timeout).await;
        if let Err(e) = resubscribed {
            tracing::warn!(error = %e, "pub/sub resubscribe failed");
            drop(shared);
            if !sleep_draining(&mut rx, &mut pending, backoff).await {
                return;
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
            continue;
        }
        backoff = Duration::from_millis(20);
        shared.connected.store(true, Ordering::SeqCst);
        shared.stats.count(crate::stats::Event::PubsubConnected);
        {
            let channels = shared.channels.lock();
            for (name, entry) in channels.iter() {
                if subscribed.contains_key(name) {
                    entry.confirmed();
                }
                // Anything may have been released while we were not listening.
                entry.wake_all();
            }
        }
        tracing::debug!(channels = subscribed.len(), "pub/sub connected");
        drop(shared);

        // Serve until the connection breaks.
        let broken = loop {
            let next = weak.upgrade().and_then(|s| s.next_timer());
            tokio::select! {
                _ = until(next) => {
                    let Some(shared) = weak.upgrade() else { return };
                    let batch: Vec<Command> = shared.fire().into_iter().map(Command::Unsubscribe).collect();
                    if let Err(e) = reconcile(&shared, &mut listener, &mut subscribed, batch, response_timeout).await {
                        break e;
                    }
                }
                cmd = rx.recv() => {
                    let Some(cmd) = cmd else { return };
                    let batch = with_queued(cmd, &mut rx);
                    let Some(shared) = weak.upgrade() else { return };
                    if let Err(e) = reconcile(&shared, &mut listener, &mut subscribed, batch, response_timeout).await {
                        break e;
                    }
                }
                _ = changed(&mut master_changed) => {
                    break "the sentinels named another master".to_string();
                }
                msg = listener.next() => {
                    let Some(msg) = msg else { break "connection closed".to_string() };
                    let Some(shared) = weak.upgrade() else { return };
                    shared.deliver(msg.get_channel_name().as_bytes(), msg.get_payload_bytes());
                }
            }
        };
        tracing::warn!(reason = %broken, "pub/sub connection lost; reconnecting");
        let Some(shared) = weak.upgrade() else { return };
        shared.disconnected();
    }
}

/// `first` and every command queued behind it, so one round trip serves them all.
pub(super) fn with_queued(
    first: Command,
    rx: &mut mpsc::UnboundedReceiver<Command>,
) -> Vec<Command> {
    let mut batch = vec![first];
    while let Ok(more) = rx.try_recv() {
        batch.push(more);
    }
    batch
}

/// Completes at `at`; never without it.
pub(super) async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
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
    listener: &mut Listener,
    subscribed: &mut HashMap<Arc<str>, bool>,
    batch: Vec<Command>,
    response_timeout: Duration,
) -> Result<(), String> {
    let mut to_sub: Vec<Wanted> = Vec::new();
    let mut to_unsub: Vec<Wanted> = Vec::new();
    let mut confirm: Vec<(Arc<str>, u64)> = Vec::new();
    {
        let channels = shared.channels.lock();
        for cmd in batch {
            match cmd {
                Command::Subscribe(ch, id) => {
                    if let Some(e) = channels.get(&ch).filter(|e| e.id == id) {
                        let queued = to_sub.iter().any(|(c, _)| *c == ch);
                        if !subscribed.contains_key(&ch) && !queued {
                            to_sub.push((ch.clone(), e.turns));
                        }
                        confirm.push((ch, id));
                    }
                }
                Command::Unsubscribe(ch) => {
                    let queued = to_unsub.iter().any(|(c, _)| *c == ch);
                    if !channels.contains_key(&ch) && !queued {
                        if let Some(&marked) = subscribed.get(&ch) {
                            to_unsub.push((ch, marked));
                        }
                    }
                }
                Command::Recheck => {}
            }
        }
    }
    listener.unsubscribe(&to_unsub, response_timeout).await?;
    for (ch, _) in &to_unsub {
        subscribed.remove(ch);
    }
    subscribe(listener, subscribed, to_sub, response_timeout).await?;
    let channels = shared.channels.lock();
    for (ch, id) in confirm {
        if let Some(entry) = channels.get(&ch).filter(|e| e.id == id) {
            entry.confirmed();
        }
    }
    Ok(())
}

/// Subscribes `wanted` and records each, marked where it asked for a mark and the
/// listener still gives marks.
async fn subscribe(
    listener: &mut Listener,
    subscribed: &mut HashMap<Arc<str>, bool>,
    wanted: Vec<Wanted>,
    response_timeout: Duration,
) -> Result<(), String> {
    listener.subscribe(&wanted, response_timeout).await?;
    let marks = listener.marks();
    subscribed.extend(wanted.into_iter().map(|(ch, mark)| (ch, mark && marks)));
    Ok(())
}

/// Sleeps `d` while keeping the command queue drained. Returns false when the hub is gone.
pub(super) async fn sleep_draining(
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
