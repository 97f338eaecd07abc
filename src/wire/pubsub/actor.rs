//! The subscriber actor of a single server or a Sentinel deployment: one connection,
//! reconciled with the channels that have waiters, reconnected when it breaks.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::{Command, HubShared, Source};

/// The actor that owns the subscriber connection.
pub(super) async fn actor(
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
            #[cfg(feature = "sentinel")]
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
            subscribe(&mut sink, &wanted, response_timeout).await
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
        shared.stats.count(crate::stats::Event::PubsubConnected);
        {
            let channels = shared.channels.lock();
            for (name, entry) in channels.iter() {
                if subscribed.contains(name) {
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
                    if let Err(e) = reconcile(&shared, &mut sink, &mut subscribed, batch, response_timeout).await {
                        break e;
                    }
                }
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
                Command::Recheck => {}
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
        subscribe(sink, &to_sub, response_timeout).await?;
        subscribed.extend(to_sub);
    }
    let channels = shared.channels.lock();
    for (ch, id) in confirm {
        if let Some(entry) = channels.get(&ch).filter(|e| e.id == id) {
            entry.confirmed();
        }
    }
    Ok(())
}

/// Subscribes `channels`.
async fn subscribe(
    sink: &mut redis::aio::PubSubSink,
    channels: &[Arc<str>],
    response_timeout: Duration,
) -> Result<(), String> {
    if channels.is_empty() {
        return Ok(());
    }
    let channels: Vec<&str> = channels.iter().map(|c| &**c).collect();
    timed(response_timeout, sink.subscribe(channels)).await
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
