//! `rlock watch`: what happens to one lock, as events in the order they happened.
//!
//! The lock is read every 100 ms, and its channels are heard in between. Two readings
//! and the messages heard between them make one step, told as the events it holds:
//! a release and the next grant are one hand-over; a delete that `force_unlock`
//! announced on the lock's channel (its event message before the unlock message) is a
//! force unlock; a holder gone with no unlock
//! message, while its TTL was about to run out, a lease that expired. Holders that left
//! are always told before holders that came, so no two events read as an overlap.
//!
//! It samples: holds that begin and end between two readings are not seen, and `a` and
//! `{a}` share one channel, so a release of one can be heard while watching the other.

use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis_rlock::protocol::{channel_name, rw_channel_name, FORCE_UNLOCK_EVENT};
use tokio::time::Instant;

use crate::clients;
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
    /// Kept from an earlier reading that showed no change.
    kept: bool,
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
    // Both kinds of channel: the lock's kind may change while it is watched. Each as a
    // pattern that matches only its own name: `PUBSUB NUMSUB` does not count a pattern,
    // so the watch is not taken for a waiter outside the line, to which releases would
    // yield (`docs/protocol.md` 2.6), nor counted among the subscribers it reports.
    let patterns = [channel_name(name), rw_channel_name(name)].map(|c| exact_pattern(&c));
    pubsub
        .psubscribe(&patterns)
        .await
        .map_err(|e| e.to_string())?;
    let mut messages = pubsub.on_message();
    // Far enough to mean "never", near enough not to overflow the clock.
    let until = Instant::now() + Duration::from_secs(seconds.unwrap_or(100 * 365 * 86_400));
    let mut w = Watcher {
        out: Out { name, json },
        pending: None,
    };
    w.out.emit("state", describe(&last));
    let mut heard = Heard::default();
    let mut last_subscribers = -1;
    let mut tick = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            m = messages.next() => {
                if let Some(m) = m {
                    hear(&mut heard, m.get_payload().ok());
                }
                continue;
            }
            _ = tick.tick() => {}
            _ = tokio::time::sleep_until(until) => {
                w.flush();
                return Ok(0);
            }
        }
        let now = snapshot(conn, name).await.map_err(|e| e.to_string())?;
        // Messages of the change just read may still be on their way on the other
        // connection: wait for them a little, but never long on a busy lock.
        let quiet = if w.holders_left(&last, &now) { 50 } else { 5 };
        let drain_until = Instant::now() + Duration::from_millis(quiet);
        while let Ok(Some(m)) = tokio::time::timeout_at(drain_until, messages.next()).await {
            hear(&mut heard, m.get_payload().ok());
        }
        // A message can come before the reading that shows its change: it is kept for
        // one more reading, no longer.
        let used = w.step(conn, &last, &now, &heard).await;
        if used || heard.kept {
            heard = Heard::default();
        } else if heard.releases > 0 || heard.forced {
            heard.kept = true;
        }
        let subscribers = other_subscribers(conn, &Kind::of(&now).channel(name)).await;
        if subscribers != last_subscribers {
            let detail = format!(
                "{subscribers} connections subscribed (clients with waiters, or that had \
                 some, and other observers; this watch listens by pattern, not counted)"
            );
            w.out.emit("subscribers", detail);
            last_subscribers = subscribers;
        }
        last = now;
    }
}

/// A message on the lock's channels: an unlock message (`0`, `1`), the force unlock's
/// event, or a turn message (a large integer naming a client), which tells nothing here.
fn hear(heard: &mut Heard, payload: Option<String>) {
    match payload.as_deref() {
        Some("0" | "1") => heard.releases += 1,
        Some(FORCE_UNLOCK_EVENT) => heard.forced = true,
        _ => {}
    }
}

struct Watcher<'a> {
    out: Out<'a>,
    /// A release that left the lock free, held back one reading: if the next shows
    /// one new holder, the two are one hand-over (the waiter took a moment to come in).
    pending: Option<String>,
}

impl Watcher<'_> {
    fn holders_left(&self, last: &Snapshot, now: &Snapshot) -> bool {
        last.holders.keys().any(|f| !now.holders.contains_key(f))
    }

    fn flush(&mut self) {
        if let Some(from) = self.pending.take() {
            self.out.emit("released", from);
        }
    }

    /// The events between two readings, holders that left first; whether the heard
    /// messages were used.
    async fn step(
        &mut self,
        conn: &mut MultiplexedConnection,
        last: &Snapshot,
        now: &Snapshot,
        heard: &Heard,
    ) -> bool {
        if let (Some(msg), None) = (not_a_lock("", now), not_a_lock("", last)) {
            self.out.emit("not-a-lock", msg.trim_start().to_string());
        }
        let left: Vec<&String> = keys_not_in(last, now);
        let came: Vec<&String> = keys_not_in(now, last);
        let clients = match came.is_empty() {
            true => None,
            false => clients::connected(conn).await,
        };
        let with_client = |f: &str| match clients::of_holder(&clients, f) {
            Some(c) => format!("{f} (client {} at {})", c.name, c.addr),
            None => f.to_string(),
        };
        // Readers share the lock: one leaving as another comes is no hand-over.
        let shared = now.mode.as_deref() == Some("read") || last.mode.as_deref() == Some("read");
        if let Some(from) = self.pending.take() {
            match came.as_slice() {
                [to] if left.is_empty() && **to != from && !shared => {
                    self.out
                        .emit("handover", format!("{from} -> {}", with_client(to)));
                    return true;
                }
                _ => self.out.emit("released", from),
            }
        }
        let expired = heard.releases == 0 && last.ttl_ms >= 0 && last.ttl_ms <= EXPIRY_SLACK_MS;
        match (left.as_slice(), came.as_slice()) {
            _ if heard.forced && !left.is_empty() => {
                let from = list(&left);
                self.out.emit(
                    "force-unlock",
                    format!("deleted by force while held by {from}"),
                );
            }
            ([from], [to]) if !expired && !shared => {
                self.out
                    .emit("handover", format!("{from} -> {}", with_client(to)));
                return true;
            }
            ([from], []) if heard.releases > 0 && now.holders.is_empty() => {
                self.pending = Some(from.to_string());
            }
            _ => {
                for field in &left {
                    self.leave(field, last, now, heard, expired);
                }
            }
        }
        for field in &came {
            let holds = now.holders[*field];
            self.out
                .emit("acquired", format!("{} holds {holds}", with_client(field)));
        }
        self.counts_and_renewal(last, now);
        !left.is_empty() || !came.is_empty()
    }

    fn leave(&self, field: &str, last: &Snapshot, now: &Snapshot, heard: &Heard, expired: bool) {
        // A fair unlock tells only the next waiter, on its own channel, and a reader
        // that leaves others reading tells nobody: silence is normal there.
        let silent_kind = Kind::of(last) != Kind::Plain || !now.holders.is_empty();
        if heard.releases > 0 || (silent_kind && !expired) {
            self.out.emit("released", field.to_string());
        } else if expired {
            let ttl = ttl_text(last.ttl_ms);
            self.out.emit(
                "expired",
                format!("{field}: its lease ran out (ttl was {ttl})"),
            );
        } else {
            // A plain lock always publishes its release; a fair lock freed with nobody
            // in its queue looks the same as a DEL by hand.
            self.out.emit(
                "released",
                format!("{field} (no unlock message: a fair unlock with nobody waiting, or a DEL by hand)"),
            );
        }
    }

    fn counts_and_renewal(&self, last: &Snapshot, now: &Snapshot) {
        for (field, holds) in &now.holders {
            match last.holders.get(field) {
                Some(n) if n != holds => self.out.emit("holds", format!("{field} {n} -> {holds}")),
                _ => {}
            }
        }
        if now.holders == last.holders && now.ttl_ms > last.ttl_ms + 50 && last.ttl_ms > 0 {
            self.out
                .emit("renewed", format!("ttl {}", ttl_text(now.ttl_ms)));
        }
    }
}

async fn other_subscribers(conn: &mut MultiplexedConnection, channel: &str) -> i64 {
    redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async::<Vec<(String, i64)>>(conn)
        .await
        .ok()
        .and_then(|v| v.first().map(|(_, n)| *n))
        .unwrap_or(0)
}

/// A `PSUBSCRIBE` pattern that matches `channel` and nothing else: glob's special
/// characters escaped.
fn exact_pattern(channel: &str) -> String {
    let mut pattern = String::with_capacity(channel.len() + 4);
    for c in channel.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern
}

fn keys_not_in<'a>(a: &'a Snapshot, b: &Snapshot) -> Vec<&'a String> {
    a.holders
        .keys()
        .filter(|f| !b.holders.contains_key(*f))
        .collect()
}

fn list(fields: &[&String]) -> String {
    fields
        .iter()
        .map(|f| f.as_str())
        .collect::<Vec<_>>()
        .join(", ")
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
