//! `rlock watch`: what happens to one lock, as events in the order they happened.
//!
//! The lock is read every 100 ms, and its channels are heard in between. Two readings
//! and the messages heard between them make one step, told as the events it holds:
//! a release and the next grant are one hand-over; a delete that `force_unlock`
//! announced on `rlock_events:{NAME}` is a force unlock; a holder gone with no unlock
//! message, while its TTL was about to run out, a lease that expired. Holders that left
//! are always told before holders that came, so no two events read as an overlap.

use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis_rlock::protocol::{channel_name, events_channel, rw_channel_name, FORCE_UNLOCK_EVENT};

use crate::snapshot::{describe, not_a_lock, snapshot, ttl_text, Kind, Snapshot};
use crate::NOT_A_LOCK;

const TICK: Duration = Duration::from_millis(100);
/// A holder gone with a TTL under this at the last reading ran out of lease.
const EXPIRY_SLACK_MS: i64 = 3 * TICK.as_millis() as i64;

/// What was heard on the lock's channels since the last reading.
#[derive(Default)]
struct Heard {
    releases: usize,
    forced: bool,
    /// Readings since the first of these messages that showed no change.
    readings: u32,
}

/// Prints events until `seconds` have passed (or forever).
pub(crate) async fn watch(
    url: &str,
    conn: &mut MultiplexedConnection,
    name: &str,
    seconds: Option<u64>,
    json: bool,
) -> Result<u8, String> {
    let mut last = snapshot(conn, name).await.map_err(|e| e.to_string())?;
    if let Some(msg) = not_a_lock(name, &last) {
        eprintln!("rlock: {msg}");
        return Ok(NOT_A_LOCK);
    }
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut pubsub = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
    // Both kinds of channel (the lock's kind may change while it is watched), and ours.
    let channels = [
        channel_name(name),
        rw_channel_name(name),
        events_channel(name),
    ];
    pubsub
        .subscribe(&channels)
        .await
        .map_err(|e| e.to_string())?;
    let mut messages = pubsub.on_message();
    let until = seconds.map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let out = Out { name, json };
    out.emit("state", describe(&last));
    let mut heard = Heard::default();
    let mut pending = None;
    let mut last_waiters = -1;
    let mut tick = tokio::time::interval(TICK);
    loop {
        if until.is_some_and(|u| tokio::time::Instant::now() >= u) {
            if let Some(from) = pending {
                out.emit("released", from);
            }
            return Ok(0);
        }
        tokio::select! {
            m = messages.next() => {
                if let Some(m) = m {
                    hear(&mut heard, m.get_channel_name(), &channels[2], m.get_payload().ok());
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        let now = snapshot(conn, name).await.map_err(|e| e.to_string())?;
        // Messages of the change just read may still be on their way on the other
        // connection: a short quiet spell on it says they are all in.
        let quiet = Duration::from_millis(if holders_left(&last, &now) { 50 } else { 5 });
        while let Ok(Some(m)) = tokio::time::timeout(quiet, messages.next()).await {
            hear(
                &mut heard,
                m.get_channel_name(),
                &channels[2],
                m.get_payload().ok(),
            );
        }
        // A message can come before the reading that shows its change: it is kept until
        // a change uses it, or for a few readings.
        if now.holders != last.holders || heard.readings >= 3 || pending.is_some() {
            step(&out, &last, &now, &std::mem::take(&mut heard), &mut pending);
        } else if heard.releases > 0 || heard.forced {
            heard.readings += 1;
        }
        let waiters = other_subscribers(conn, &Kind::of(&now).channel(name)).await;
        if waiters != last_waiters {
            out.emit("waiters", format!("{waiters} other subscribed clients"));
            last_waiters = waiters;
        }
        last = now;
    }
}

fn hear(heard: &mut Heard, channel: &str, events: &str, payload: Option<String>) {
    if channel != events {
        heard.releases += 1;
    } else if payload.as_deref() == Some(FORCE_UNLOCK_EVENT) {
        heard.forced = true;
    }
}

fn holders_left(last: &Snapshot, now: &Snapshot) -> bool {
    last.holders.keys().any(|f| !now.holders.contains_key(f))
}

/// The events between two readings: holders that left first, then those that came.
/// A release that leaves the lock free is held back one reading: if the next shows one
/// new holder, the two are one hand-over (the waiter took a moment to come in).
fn step(out: &Out, last: &Snapshot, now: &Snapshot, heard: &Heard, pending: &mut Option<String>) {
    if let (Some(msg), false) = (not_a_lock("", now), not_a_lock("", last).is_some()) {
        out.emit("not-a-lock", msg.trim_start().to_string());
    }
    let left: Vec<&String> = last
        .holders
        .keys()
        .filter(|f| !now.holders.contains_key(*f))
        .collect();
    let came: Vec<&String> = now
        .holders
        .keys()
        .filter(|f| !last.holders.contains_key(*f))
        .collect();
    if let Some(from) = pending.take() {
        if let ([], [to]) = (left.as_slice(), came.as_slice()) {
            out.emit("handover", format!("{from} -> {to}"));
            return;
        }
        out.emit("released", from);
    }
    let expired = heard.releases == 0 && last.ttl_ms >= 0 && last.ttl_ms <= EXPIRY_SLACK_MS;
    match (left.as_slice(), came.as_slice()) {
        _ if heard.forced && !left.is_empty() => {
            out.emit(
                "force-unlock",
                format!("deleted by force while held by {}", list(&left)),
            );
        }
        ([from], [to]) if !expired => {
            out.emit("handover", format!("{from} -> {to}"));
            return;
        }
        ([from], []) if heard.releases > 0 && now.holders.is_empty() => {
            *pending = Some(from.to_string());
        }
        _ => {
            for field in &left {
                leave(out, field, last, heard, expired);
            }
        }
    }
    for field in &came {
        out.emit("acquired", format!("{field} holds {}", now.holders[*field]));
    }
    for (field, holds) in &now.holders {
        match last.holders.get(field) {
            Some(n) if n != holds => out.emit("holds", format!("{field} {n} -> {holds}")),
            _ => {}
        }
    }
    if now.holders == last.holders && now.ttl_ms > last.ttl_ms + 50 && last.ttl_ms > 0 {
        out.emit("renewed", format!("ttl {}", ttl_text(now.ttl_ms)));
    }
}

fn leave(out: &Out, field: &str, last: &Snapshot, heard: &Heard, expired: bool) {
    if heard.releases > 0 {
        out.emit("released", field.to_string());
    } else if expired {
        out.emit(
            "expired",
            format!(
                "{field}: its lease ran out (ttl was {})",
                ttl_text(last.ttl_ms)
            ),
        );
    } else {
        out.emit(
            "deleted",
            format!("{field}: gone with no unlock message (a DEL?); waiters were not woken"),
        );
    }
}

fn list(fields: &[&String]) -> String {
    fields
        .iter()
        .map(|f| f.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

async fn other_subscribers(conn: &mut MultiplexedConnection, channel: &str) -> i64 {
    redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async::<Vec<(String, i64)>>(conn)
        .await
        .ok()
        .and_then(|v| v.first().map(|(_, n)| *n - 1))
        .unwrap_or(0)
}

struct Out<'a> {
    name: &'a str,
    json: bool,
}

impl Out<'_> {
    fn emit(&self, event: &str, detail: String) {
        let name = self.name;
        if self.json {
            println!(
                "{}",
                serde_json::json!({"name": name, "event": event, "detail": detail})
            );
        } else {
            println!("{name}\t{event}\t{detail}");
        }
    }
}
