//! The raw protocol: one function per script, no guards, no waiting.
//!
//! Kept apart from the lock handle and its guards the way `lock_api` keeps `RawMutex`
//! apart from its guards: everything here is one round trip on a [`Conn`], with the reply
//! decoded.

use std::time::Duration;

use redis::{FromRedisValue, Value};

use crate::error::{Error, Result};
use crate::identity::Kind;
use crate::wire::connection::{Conn, Synced};
use crate::wire::scripts::{ScriptCall, RENEW};
use crate::wire::slot::{has_hash_tag, key_slot};

/// The message published on a lock's channel when it is released (Redisson's
/// `LockPubSub.UNLOCK_MESSAGE`).
pub const UNLOCK_MESSAGE: &str = "0";

impl Kind {
    /// The lock's channel (a fair lock's waiters each listen on `<channel>:<field>`).
    pub(crate) fn channel(self, name: &str) -> String {
        match self {
            Kind::Plain | Kind::Fair => channel_name(name),
            Kind::Read | Kind::Write => rw_channel_name(name),
        }
    }
}

/// How many times one acquire or unlock is sent when its reply may have been lost
/// (timeout, broken connection).
pub(crate) const ATTEMPTS: u32 = 3;

/// How long a retried release's outcome is kept in its latch, for copies of its earlier
/// sends that reach Redis late (a connection given up with a send in its buffer, whose
/// bytes get through once a partition heals): a copy later than this is not guarded.
pub(crate) const LATE_COPIES: Duration = Duration::from_secs(600);

mod fair;
mod flags;
mod force;
mod plain;
mod replies;
mod rw;
mod shape;
mod turns;
mod undo;

pub(crate) use flags::Line;
use replies::{AcquireReply, UnlockReply};
use undo::rollback;

pub(crate) use fair::{fair_leave, waiter_channel};
pub use fair::{queue_key, timeout_key};
pub(crate) use force::force_release;
pub use force::FORCE_UNLOCK_EVENT;
pub(crate) use rw::{clear_mark, force_release_rw, renew_read, RW_CHANNEL_PREFIX};
pub use rw::{read_turn_key, reader_key, rw_channel_name, writer_key, READ_UNLOCK_MESSAGE};
pub use shape::{is_holder_field, is_lock_hash};
pub use turns::{clients_key, turn_key, turn_message};
pub(crate) use turns::{leave_line, lock_pttl, TurnMessage};

/// `<prefix>:{<name>}`, or `<prefix>:<name>` when the name carries its own hash tag
/// (Redisson's `prefixName`). Either way the result hashes to the lock key's cluster
/// slot, except for names with braces that form no tag (see [`cluster_safe`]).
pub(crate) fn prefixed(prefix: &str, name: &str) -> String {
    // Redisson tests for any `{`; a `{` that opens no tag (`a{b`) would then leave the
    // prefixed key in another slot, so only a real tag counts here.
    // Built by hand: this runs for every call, and `format!` cost several times more.
    let tagged = has_hash_tag(name.as_bytes());
    // Room for the braces and a request id's suffix, so that adding it reallocates not.
    let mut key = String::with_capacity(prefix.len() + name.len() + 3 + 52);
    key.push_str(prefix);
    // A fixed length a branch (see `ScriptCall::key_own`).
    match tagged {
        true => key.push(':'),
        false => key.push_str(":{"),
    }
    key.push_str(name);
    if !tagged {
        key.push('}');
    }
    key
}

/// True when every auxiliary key of `name` hashes to the slot of `name` itself.
pub(crate) fn cluster_safe(name: &str) -> bool {
    key_slot(name.as_bytes()) == key_slot(channel_name(name).as_bytes())
}

/// The pub/sub channel of the lock `name`: `redisson_lock__channel:{<name>}`.
pub fn channel_name(name: &str) -> String {
    prefixed("redisson_lock__channel", name)
}

const LOCK_CHANNEL_PREFIX: &str = "redisson_lock__channel:";

/// Whether `channel` is a lock's (plain, fair or read-write): the only channels on which
/// turn messages and force-unlock events are sent.
pub(crate) fn is_lock_channel(channel: &str) -> bool {
    channel.starts_with(LOCK_CHANNEL_PREFIX) || channel.starts_with(RW_CHANNEL_PREFIX)
}

/// The fencing token counter of the lock `name`: `redisson_lock_token:{<name>}`, the key
/// Redisson's fenced lock uses.
pub fn token_key(name: &str) -> String {
    prefixed("redisson_lock_token", name)
}

/// The latch that makes one unlock request idempotent:
/// `redisson_unlock_latch:{<name>}:<request id>` (Redisson's layout).
pub(crate) fn latch_key(name: &str, request_id: &str) -> String {
    suffixed(prefixed(LATCH, name), request_id)
}

const LATCH: &str = "redisson_unlock_latch";

fn suffixed(mut key: String, request_id: &str) -> String {
    key.push(':');
    key.push_str(request_id);
    key
}

/// [`latch_key`] with a fresh request id, written in place (one allocation per call,
/// not two).
pub(crate) fn fresh_latch_key(name: &str) -> String {
    let mut key = prefixed(LATCH, name);
    key.push(':');
    push_request_id(&mut key);
    key
}

/// The latch that makes one acquire request idempotent, with a fresh request id. It
/// shares the unlock latches' name (`redisson_unlock_latch:{<name>}:<request id>`):
/// every request draws an id of its own, and ours hold a `-` that Redisson's hex ids
/// never do, so no two latches meet, and a lock costs one latch name in Redis, not two.
pub(crate) fn fresh_acquire_latch_key(name: &str) -> String {
    fresh_latch_key(name)
}

/// A fresh request id, unique across processes: a random prefix drawn once per process,
/// then a counter, so that no request pays for drawing randomness of its own.
pub(crate) fn request_id() -> String {
    let mut id = String::with_capacity(32 + 17);
    push_request_id(&mut id);
    id
}

/// Appends a fresh [`request_id`] to `to`.
fn push_request_id(to: &mut String) {
    static PREFIX: once_cell::sync::Lazy<String> =
        once_cell::sync::Lazy::new(|| uuid::Uuid::new_v4().simple().to_string());
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // By hand: one of these is made per call, and `format!` cost more than the rest of it.
    to.push_str(&PREFIX);
    to.push('-');
    let digits = (64 - (n | 1).leading_zeros()).div_ceil(4);
    for i in (0..digits).rev() {
        let d = ((n >> (4 * i)) & 0xf) as u32;
        to.push(char::from_digit(d, 16).expect("a hex digit"));
    }
}

/// Outcome of one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The caller now holds the lock (one more hold), with this fencing token (0 for a
    /// plain lock); `latched`
    /// when the script wrote the acquire latch, which the caller then discards.
    Acquired { token: u64, latched: bool },
    /// Someone else holds it; the value is its PTTL (`None` if the key has no expiry).
    Busy(Option<Duration>),
    /// It is free, but another client's turn, which ends after this long.
    TurnBusy(Duration),
}

/// Outcome of one unlock call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// The caller held nothing.
    NotHeld,
    /// One hold released, others remain.
    StillHeld,
    /// The last hold released; the key is deleted and waiters were told.
    Released,
    /// The last hold released and the lock given to the waiter named in the call, with
    /// this fencing token (0 for a plain lock); nothing was published. `unacked`: replica
    /// sync is on and no replica acknowledged it, so the waiter must give it back.
    HandedOver { token: u64, unacked: bool },
    /// Released and published instead of handed over: another client waited in line,
    /// and the call said to give way to it.
    GaveWay,
}

/// Milliseconds as a `u64`, which formats at half the cost of the `u128` of `as_millis`
/// (durations reaching Redis are bounded far below `u64::MAX` ms).
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn unexpected(what: &str, v: &Value) -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        format!("{what} script answered {v:?}"),
    )))
}

/// The acquire script's inputs.
pub(crate) struct AcquireCall<'a> {
    pub(crate) name: &'a str,
    pub(crate) token_key: &'a str,
    pub(crate) latch: &'a str,
    pub(crate) field: &'a str,
    pub(crate) lease: Duration,
    pub(crate) latch_ttl: Duration,
    /// The client knows of no hold of `field` on this lock (see `lua/acquire.lua`).
    pub(crate) fresh: bool,
    /// This request was sent before and its reply was lost.
    pub(crate) retry: bool,
    /// A fenced lock: a grant INCRs the token counter.
    pub(crate) fenced: bool,
    pub(crate) kind: Kind,
    /// How long a published release keeps the lock for the next client in line (`ZERO`:
    /// turns off; see `lua/acquire.lua`).
    pub(crate) turn_window: Duration,
    /// The fair lock's wait timeout (`ClientBuilder::fair_lock_wait_timeout`).
    pub(crate) fair_wait: Duration,
    /// The caller waits if the lock is busy: the client joins the line.
    pub(crate) waits: bool,
    /// What a first grant does to the client's place in the line.
    pub(crate) line: Line,
}

fn flag(b: bool) -> &'static str {
    if b {
        "1"
    } else {
        "0"
    }
}

pub(crate) async fn acquire(conn: &Conn, call: &AcquireCall<'_>) -> Result<Attempt> {
    let script = match call.kind {
        Kind::Plain => plain::acquire_call(call),
        Kind::Read | Kind::Write => rw::acquire_call(call),
        Kind::Fair => fair::acquire_call(call),
    };
    let reply = script
        .run(conn)
        .await
        .map_err(|e| conn.error(e, call.name))?;
    let (reply, synced) = reply;
    let decoded =
        AcquireReply::from_redis_value(reply.clone()).map_err(|_| unexpected("acquire", &reply))?;
    match decoded {
        AcquireReply::Granted { .. } if synced == Synced::Acked(0) => {
            // Rare, and boxed so that the common path's future stays small.
            Box::pin(rollback(conn, call)).await;
            let waited = match conn.sync() {
                crate::config::ReplicaSync::Wait { timeout, .. } => *timeout,
                crate::config::ReplicaSync::Off => Duration::ZERO,
            };
            Err(Error::NotReplicated {
                name: call.name.to_string(),
                waited,
            })
        }
        AcquireReply::Granted { token, latched } if token_ok(call.fenced, token) => {
            Ok(Attempt::Acquired {
                token: token as u64,
                latched,
            })
        }
        AcquireReply::Granted { .. } => Err(unexpected("acquire", &reply)),
        AcquireReply::TurnBusy(ttl) => {
            Ok(Attempt::TurnBusy(Duration::from_millis(ttl.max(0) as u64)))
        }
        AcquireReply::Busy(ttl) if ttl >= 0 => {
            Ok(Attempt::Busy(Some(Duration::from_millis(ttl as u64))))
        }
        // -1: a hash without expiry, written by someone else; -2 cannot happen (the
        // script saw the key), but would mean "gone", and a retry is right either way.
        AcquireReply::Busy(-2) => Ok(Attempt::Busy(Some(Duration::ZERO))),
        AcquireReply::Busy(_) => Ok(Attempt::Busy(None)),
    }
}

/// A fenced grant carries a token of at least 1; a plain one carries 0.
fn token_ok(fenced: bool, token: i64) -> bool {
    if fenced {
        token > 0
    } else {
        token == 0
    }
}

/// The unlock script's inputs: which holds to release, and the request id that makes a
/// retry of the same call replay its first outcome.
pub(crate) struct ReleaseCall<'a> {
    pub(crate) name: &'a str,
    pub(crate) channel: &'a str,
    pub(crate) token_key: &'a str,
    pub(crate) latch: &'a str,
    pub(crate) field: &'a str,
    /// A waiter to hand the lock to on a full release: its holder field and lease.
    pub(crate) next: Option<(&'a str, Duration)>,
    /// Lease to keep on the key while holds remain (`None`: leave the TTL).
    pub(crate) keep: Option<Duration>,
    /// How many holds of the hash's count this call gives back.
    pub(crate) holds: u32,
    pub(crate) latch_ttl: Duration,
    /// This request was sent before and its reply was lost.
    pub(crate) retry: bool,
    /// A fenced lock: a hand-over INCRs the token counter.
    pub(crate) fenced: bool,
    pub(crate) kind: Kind,
    /// How long a published release keeps the lock for the next client in line.
    pub(crate) turn_window: Duration,
    /// Whether the hand-over to `next` gives way to another client waiting in line.
    pub(crate) gives_way: bool,
    /// The hand-over to `next` comes after the client's run of them is over: it goes
    /// ahead only if nobody outside this client may be waiting (flag `e`).
    pub(crate) ends_run: bool,
    /// The client listens on the lock's channel (it is subscribed, or subscribing), so
    /// that a release counts it among the channel's subscribers it can explain
    /// (`docs/protocol.md` 2.6).
    pub(crate) listens: bool,
}

pub(crate) async fn release(conn: &Conn, call: &ReleaseCall<'_>) -> Result<Release> {
    let script = match call.kind {
        Kind::Plain => plain::release_call(conn, call),
        Kind::Read | Kind::Write => rw::release_call(conn, call),
        Kind::Fair => fair::release_call(conn, call),
    };
    // Only a release that may hand over waits for a replica, as a hand-over is a grant.
    // Any other would wait for an answer nothing acts on: a release lost at failover
    // leaves a lock that ends with its lease, which is safe.
    let sent = match call.next {
        Some(_) => script.run(conn).await,
        None => script.run_unsynced(conn).await,
    };
    let (reply, synced) = sent.map_err(|e| conn.error(e, call.name))?;
    let decoded =
        UnlockReply::from_redis_value(reply.clone()).map_err(|_| unexpected("unlock", &reply))?;
    match decoded {
        UnlockReply::NotHeld => Ok(Release::NotHeld),
        UnlockReply::StillHeld => Ok(Release::StillHeld),
        UnlockReply::Released => Ok(Release::Released),
        UnlockReply::GaveWay if call.next.is_some() => Ok(Release::GaveWay),
        UnlockReply::GaveWay => Err(unexpected("unlock", &reply)),
        UnlockReply::HandedOver(token) if token_ok(call.fenced, token) && call.next.is_some() => {
            Ok(Release::HandedOver {
                token: token as u64,
                unacked: synced == Synced::Acked(0),
            })
        }
        UnlockReply::HandedOver(_) => Err(unexpected("unlock", &reply)),
    }
}

/// Renews a batch of `(name, field)` pairs; `true` where the lease was extended.
pub(crate) async fn renew(
    conn: &Conn,
    batch: &[(&str, &str)],
    lease: Duration,
) -> Result<Vec<bool>> {
    let mut call = RENEW.call();
    for (name, _) in batch {
        call = call.key(name);
    }
    renewed(call, conn, batch, lease, "renew").await
}

/// Sends a batched renewal whose keys are already in `call` (the lease and the fields
/// follow); `true` per pair whose lease was extended.
pub(crate) async fn renewed(
    mut call: ScriptCall,
    conn: &Conn,
    batch: &[(&str, &str)],
    lease: Duration,
    what: &str,
) -> Result<Vec<bool>> {
    call = call.arg(ms(lease));
    for (_, field) in batch {
        call = call.arg(field);
    }
    let first = batch.first().map(|b| b.0).unwrap_or("");
    let (reply, _) = call.run(conn).await.map_err(|e| conn.error(e, first))?;
    match reply {
        Value::Array(items) if items.len() == batch.len() => Ok(items
            .into_iter()
            .map(|v| i64::from_redis_value(v).ok() == Some(1))
            .collect()),
        ref v => Err(unexpected(what, v)),
    }
}

/// Sends a script that answers 1 or 0 (a force unlock, a fair waiter leaving).
pub(crate) async fn one_or_zero(
    call: ScriptCall,
    conn: &Conn,
    name: &str,
    what: &str,
) -> Result<bool> {
    let (reply, _) = call.run(conn).await.map_err(|e| conn.error(e, name))?;
    match i64::from_redis_value(reply.clone()) {
        Ok(n) => Ok(n == 1),
        Err(_) => Err(unexpected(what, &reply)),
    }
}

/// Runs a plain command that reads the lock's key.
pub(crate) async fn query(conn: &Conn, name: &str, cmd: redis::Cmd) -> Result<Value> {
    conn.query(&cmd).await.map_err(|e| conn.error(e, name))
}

#[cfg(test)]
mod tests;
