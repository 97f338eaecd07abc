//! What `rlock` reads of one name: its key's type, its holders, its kind of lock.

use std::collections::BTreeMap;

use redis::aio::MultiplexedConnection;

use crate::clients::{self, Clients};
use redis_rlock::protocol::{
    channel_name, is_holder_field, is_lock_hash, queue_key, rw_channel_name,
};

/// What a lock hash holds, read in one go.
#[derive(Default, PartialEq)]
pub(crate) struct Snapshot {
    pub(crate) exists: bool,
    /// The key's type (`none` when absent): a lock is a `hash`.
    pub(crate) key_type: String,
    /// The name has a fair lock's waiting queue.
    pub(crate) fair_queue: bool,
    pub(crate) holders: BTreeMap<String, i64>,
    /// A read-write lock's `mode` field.
    pub(crate) mode: Option<String>,
    /// Fields that are neither a holder's nor `mode`.
    pub(crate) other_fields: usize,
    /// The hash follows a lock's rule (`protocol::is_lock_hash`): fields and values.
    pub(crate) lock_shaped: bool,
    pub(crate) ttl_ms: i64,
}

impl Snapshot {
    /// A lock hash: holders, and no field but theirs and `mode`.
    pub(crate) fn is_lock(&self) -> bool {
        self.exists && self.lock_shaped
    }
}

/// What kind of lock a snapshot shows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Plain,
    Fair,
    ReadWrite,
}

impl Kind {
    pub(crate) fn of(s: &Snapshot) -> Kind {
        if s.mode.is_some() {
            Kind::ReadWrite
        } else if s.fair_queue {
            Kind::Fair
        } else {
            Kind::Plain
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Plain => "lock",
            Kind::Fair => "fair lock",
            Kind::ReadWrite => "read-write lock",
        }
    }

    pub(crate) fn channel(self, name: &str) -> String {
        match self {
            Kind::ReadWrite => rw_channel_name(name),
            Kind::Plain | Kind::Fair => channel_name(name),
        }
    }
}

pub(crate) async fn snapshot(
    conn: &mut MultiplexedConnection,
    name: &str,
) -> redis::RedisResult<Snapshot> {
    let (kind, ttl, queue): (String, i64, i64) = redis::pipe()
        .cmd("TYPE")
        .arg(name)
        .cmd("PTTL")
        .arg(name)
        .cmd("EXISTS")
        .arg(queue_key(name))
        .query_async(conn)
        .await?;
    // Only a hash is read as one: HGETALL of another type fails. Bytes: a field that is
    // not UTF-8 is data, not a reason to stop.
    let all: BTreeMap<Vec<u8>, Vec<u8>> = if kind == "hash" {
        redis::cmd("HGETALL").arg(name).query_async(conn).await?
    } else {
        BTreeMap::new()
    };
    // Deleted between the two reads: as if it were read gone.
    let kind = if kind == "hash" && all.is_empty() {
        "none".to_string()
    } else {
        kind
    };
    let mut s = Snapshot {
        exists: kind == "hash",
        fair_queue: queue == 1,
        key_type: kind,
        ttl_ms: ttl,
        ..Default::default()
    };
    let entries: Vec<_> = all.into_iter().collect();
    s.lock_shaped = is_lock_hash(&entries);
    for (field, value) in entries {
        let (field, value) = (
            String::from_utf8_lossy(&field),
            String::from_utf8_lossy(&value),
        );
        if field == "mode" {
            s.mode = Some(value.into_owned());
        } else if is_holder_field(&field) {
            s.holders
                .insert(field.into_owned(), value.parse().unwrap_or(0));
        } else {
            s.other_fields += 1;
        }
    }
    Ok(s)
}

pub(crate) fn ttl_text(ms: i64) -> String {
    match ms {
        -1 => "no expiry".to_string(),
        ms if ms < 0 => "-".to_string(),
        ms => format!("{:.3} s", ms as f64 / 1000.0),
    }
}

pub(crate) fn snapshot_json(name: &str, s: &Snapshot, clients: &Clients) -> serde_json::Value {
    let holders: Vec<_> = s
        .holders
        .iter()
        .map(|(f, n)| serde_json::json!({"field": f, "holds": n, "client": clients::json(clients, f)}))
        .collect();
    serde_json::json!({
        "name": name,
        "exists": s.exists,
        "mode": s.mode,
        "holders": holders,
        "ttl_ms": if s.ttl_ms >= 0 { Some(s.ttl_ms) } else { None },
    })
}

/// The message for a key that is there but no lock; `None` for a lock or no key.
pub(crate) fn not_a_lock(name: &str, s: &Snapshot) -> Option<String> {
    match s.key_type.as_str() {
        "hash" if !s.lock_shaped => Some(format!(
            "{name} is a hash that is not a lock (its fields or values are not a lock's: application data, say); nothing done"
        )),
        "hash" | "none" | "" => None,
        "string" => Some(format!(
            "{name} is a string, not a lock (a semaphore's or latch's count, say); nothing done"
        )),
        other => Some(format!("{name} is a {other}, not a lock; nothing done")),
    }
}

pub(crate) fn describe(s: &Snapshot) -> String {
    if s.holders.is_empty() {
        return "free".to_string();
    }
    let holders: Vec<String> = s.holders.iter().map(|(f, n)| format!("{f} x{n}")).collect();
    format!(
        "held by {} (ttl {})",
        holders.join(", "),
        ttl_text(s.ttl_ms)
    )
}
