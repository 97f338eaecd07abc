//! What `rlock` reads of one name: its key's type, its holders, its kind of lock.

use std::collections::BTreeMap;

use redis::aio::MultiplexedConnection;
use redis_rlock::protocol::{channel_name, queue_key, rw_channel_name};

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
    pub(crate) ttl_ms: i64,
}

/// Whether a hash field looks like a holder: `<uuid>:<owner id>` (a write holder of a
/// read-write lock ends in `:write`).
fn is_holder_field(field: &str) -> bool {
    let Some((uuid, rest)) = field.split_at_checked(36) else {
        return false;
    };
    uuid.len() == 36
        && uuid.bytes().filter(|b| *b == b'-').count() == 4
        && uuid.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit())
        && rest.starts_with(':')
        && rest.len() > 1
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
    // Only a hash is read as one: HGETALL of another type fails.
    let all: BTreeMap<String, String> = if kind == "hash" {
        redis::cmd("HGETALL").arg(name).query_async(conn).await?
    } else {
        BTreeMap::new()
    };
    let mut s = Snapshot {
        exists: kind == "hash",
        fair_queue: queue == 1,
        key_type: kind,
        ttl_ms: ttl,
        ..Default::default()
    };
    for (field, value) in all {
        if field == "mode" {
            s.mode = Some(value);
        } else if is_holder_field(&field) {
            if let Ok(n) = value.parse() {
                s.holders.insert(field, n);
            }
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

pub(crate) fn snapshot_json(name: &str, s: &Snapshot) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "exists": s.exists,
        "mode": s.mode,
        "holders": s.holders.iter().map(|(f, n)| serde_json::json!({"field": f, "holds": n})).collect::<Vec<_>>(),
        "ttl_ms": if s.ttl_ms >= 0 { Some(s.ttl_ms) } else { None },
    })
}

/// The message for a key that is there but no lock; `None` for a lock or no key.
pub(crate) fn not_a_lock(name: &str, s: &Snapshot) -> Option<String> {
    match s.key_type.as_str() {
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
