//! The raw protocol of the semaphores and the count-down latch (Redisson's `RSemaphore`,
//! `RPermitExpirableSemaphore`, `RCountDownLatch`): key and channel names, and one
//! function per script, each one round trip with its reply decoded. No waiting here.

use std::time::Duration;

use redis::{FromRedisValue, Value};

use crate::config::{ReplicaSync, MAX_NAME_LEN};
use crate::error::{Error, Result};
use crate::wire::connection::{Conn, Synced};
use crate::wire::raw::prefixed;
use crate::wire::scripts::{
    ScriptCall, COUNT_DELETE, LATCH_COUNT_DOWN, LATCH_SET, PERMIT_ACQUIRE, PERMIT_AVAILABLE,
    PERMIT_RELEASE, PERMIT_RENEW, PERMIT_UPDATE, SEMAPHORE_ACQUIRE, SEMAPHORE_DRAIN,
    SEMAPHORE_RELEASE, SEMAPHORE_SET,
};
use crate::wire::slot::{has_hash_tag, key_slot};

/// The channel of the semaphore (or permit-expirable semaphore) `name`:
/// `redisson_sc:{<name>}`, or `redisson_sc:<name>` when the name carries its own hash tag
/// (Redisson's `prefixName`, as for the lock channel).
pub fn semaphore_channel(name: &str) -> String {
    prefixed("redisson_sc", name)
}

/// The lease set of the permit-expirable semaphore `name`: `{<name>}:timeout`, or
/// `<name>:timeout` when the name carries its own hash tag (Redisson's `suffixName`).
pub fn permit_timeout_key(name: &str) -> String {
    if has_hash_tag(name.as_bytes()) {
        format!("{name}:timeout")
    } else {
        format!("{{{name}}}:timeout")
    }
}

/// The channel of the count-down latch `name`:
/// `redisson_countdownlatch__channel__{<name>}`. Redisson adds the braces whatever the
/// name holds, so a name with its own hash tag puts its channel in another cluster slot.
pub fn latch_channel(name: &str) -> String {
    format!("redisson_countdownlatch__channel__{{{name}}}")
}

/// Published when a latch reaches zero (Redisson's `ZERO_COUNT_MESSAGE`).
pub const LATCH_ZERO_MESSAGE: &str = "0";
/// Published when a latch's count is set (Redisson's `NEW_COUNT_MESSAGE`).
pub const LATCH_NEW_COUNT_MESSAGE: &str = "1";

/// Checks a synchronizer's name: not empty, not too long, and on a cluster every key in
/// `aux` (its channel, its lease set) in the name's slot.
pub(crate) fn check_name(name: &str, cluster: bool, aux: &[&str]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::EmptyName);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::NameTooLong {
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    let slot = key_slot(name.as_bytes());
    if cluster && aux.iter().any(|k| key_slot(k.as_bytes()) != slot) {
        return Err(Error::NameNotClusterSafe {
            name: name.to_string(),
        });
    }
    Ok(())
}

/// Checks a permit or count argument: at least 1.
pub(crate) fn check_count(what: &'static str, n: u32) -> Result<()> {
    if n == 0 {
        return Err(Error::InvalidCount {
            what,
            value: 0,
            reason: "must be at least 1",
        });
    }
    Ok(())
}

fn unexpected(what: &str, v: &Value) -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        format!("{what} script answered {v:?}"),
    )))
}

async fn run(call: ScriptCall, conn: &Conn, name: &str) -> Result<(Value, Synced)> {
    call.run(conn).await.map_err(|e| conn.error(e, name))
}

fn int(what: &str, v: Value) -> Result<i64> {
    i64::from_redis_value(v.clone()).map_err(|_| unexpected(what, &v))
}

fn not_replicated(conn: &Conn, name: &str) -> Error {
    let waited = match conn.sync() {
        ReplicaSync::Wait { timeout, .. } => *timeout,
        ReplicaSync::Off => Duration::ZERO,
    };
    Error::NotReplicated {
        name: name.to_string(),
        waited,
    }
}

/// How [`semaphore_release`] treats an absent key.
#[derive(Clone, Copy)]
pub(crate) enum Give {
    /// Only into an existing semaphore (`None` when absent).
    Release,
    /// Redisson's `addPermits`: an absent key counts as 0; the amount may be negative.
    Add,
}

/// The latch of one semaphore acquire request:
/// `redisson_semaphore_latch:{<name>}:<request id>` (this crate's own key).
pub(crate) fn semaphore_latch(name: &str, request_id: &str) -> String {
    format!(
        "{}:{request_id}",
        crate::wire::raw::prefixed("redisson_semaphore_latch", name)
    )
}

/// Takes `n` permits, all or none. `Ok(false)`: fewer are available. A take that no
/// replica acknowledged is given back and answered [`Error::NotReplicated`]. `latch`
/// makes the request count once: a `retry` of it whose first send took the permits
/// answers `true` without taking more.
pub(crate) async fn semaphore_acquire(
    conn: &Conn,
    name: &str,
    channel: &str,
    n: u32,
    (latch, latch_ttl, retry): (&str, std::time::Duration, bool),
) -> Result<bool> {
    let call = SEMAPHORE_ACQUIRE
        .call()
        .key(name)
        .key(latch)
        .arg(n)
        .arg(if retry { "1" } else { "0" })
        .arg(latch_ttl.as_millis().max(1) as u64);
    let (v, synced) = run(call, conn, name).await?;
    let taken = int("semaphore acquire", v)? == 1;
    if taken && synced == Synced::Acked(0) {
        let back = semaphore_release(conn, name, channel, i64::from(n), Give::Release).await;
        tracing::warn!(semaphore = %name, ?back, "no replica acknowledged the permits taken; given back");
        return Err(not_replicated(conn, name));
    }
    Ok(taken)
}

/// Gives (or, with [`Give::Add`], adds) `n` permits; the new count, `None` when
/// [`Give::Release`] found no semaphore.
pub(crate) async fn semaphore_release(
    conn: &Conn,
    name: &str,
    channel: &str,
    n: i64,
    how: Give,
) -> Result<Option<i64>> {
    let mode = match how {
        Give::Release => "release",
        Give::Add => "add",
    };
    let call = SEMAPHORE_RELEASE
        .call()
        .key(name)
        .key(channel)
        .arg(n)
        .arg(conn.publish_command())
        .arg(mode);
    match run(call, conn, name).await {
        Ok((Value::Nil, _)) => Ok(None),
        Ok((v, _)) => int("semaphore release", v).map(Some),
        Err(Error::Redis(e)) if e.code() == Some("OVERFLOW") => Err(Error::InvalidCount {
            what: "permits",
            value: n,
            reason: "the semaphore's count would leave the 64-bit range; nothing was written",
        }),
        Err(e) => Err(e),
    }
}

/// Sets the permits of an absent semaphore (either kind); whether it was absent.
pub(crate) async fn semaphore_set(conn: &Conn, name: &str, channel: &str, n: u32) -> Result<bool> {
    let call = SEMAPHORE_SET
        .call()
        .key(name)
        .key(channel)
        .arg(n)
        .arg(conn.publish_command());
    Ok(int("semaphore set", run(call, conn, name).await?.0)? == 1)
}

/// Takes every available permit; how many there were.
pub(crate) async fn semaphore_drain(conn: &Conn, name: &str) -> Result<i64> {
    int(
        "semaphore drain",
        run(SEMAPHORE_DRAIN.call().key(name), conn, name).await?.0,
    )
}

/// The integer a semaphore or latch key holds; 0 when absent.
pub(crate) async fn read_count(conn: &Conn, name: &str) -> Result<i64> {
    let v = conn
        .query(redis::cmd("GET").arg(name))
        .await
        .map_err(|e| conn.error(e, name))?;
    match v {
        Value::Nil => Ok(0),
        v => i64::from_redis_value(v).map_err(|_| Error::WrongType {
            key: name.to_string(),
        }),
    }
}

/// The keys of one permit-expirable semaphore.
pub(crate) struct PermitKeys<'a> {
    pub(crate) name: &'a str,
    pub(crate) timeout: &'a str,
    pub(crate) channel: &'a str,
}

impl PermitKeys<'_> {
    fn call(&self, script: &'static crate::wire::scripts::LuaScript) -> ScriptCall {
        script
            .call()
            .key(self.name)
            .key(self.timeout)
            .key(self.channel)
    }
}

/// What a permit acquire found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitTry {
    /// The permits are taken.
    Taken,
    /// Too few available; the earliest lease ends in this long (`None`: none will).
    Busy(Option<Duration>),
}

/// Takes one permit per id with `lease`. A take that no replica acknowledged is given
/// back and answered [`Error::NotReplicated`].
pub(crate) async fn permit_acquire(
    conn: &Conn,
    keys: &PermitKeys<'_>,
    lease: Duration,
    ids: &[[u8; 16]],
) -> Result<PermitTry> {
    let mut call = keys
        .call(&PERMIT_ACQUIRE)
        .arg(ids.len())
        .arg(lease.as_millis() as u64)
        .arg(conn.publish_command());
    for id in ids {
        call = call.arg(&id[..]);
    }
    let (v, synced) = run(call, conn, keys.name).await?;
    let (kind, ms): (i64, i64) = FromRedisValue::from_redis_value(v.clone())
        .map_err(|_| unexpected("permit acquire", &v))?;
    match kind {
        1 if synced == Synced::Acked(0) => {
            let back = permit_release(conn, keys, ids).await;
            tracing::warn!(semaphore = %keys.name, ?back, "no replica acknowledged the permits taken; given back");
            Err(not_replicated(conn, keys.name))
        }
        1 => Ok(PermitTry::Taken),
        0 if ms >= 0 => Ok(PermitTry::Busy(Some(Duration::from_millis(ms as u64)))),
        0 => Ok(PermitTry::Busy(None)),
        _ => Err(unexpected("permit acquire", &v)),
    }
}

/// Gives back the permits `ids` (and every one whose lease ended); how many of `ids`
/// were held with a live lease.
pub(crate) async fn permit_release(
    conn: &Conn,
    keys: &PermitKeys<'_>,
    ids: &[[u8; 16]],
) -> Result<i64> {
    let mut call = keys.call(&PERMIT_RELEASE).arg(conn.publish_command());
    for id in ids {
        call = call.arg(&id[..]);
    }
    int("permit release", run(call, conn, keys.name).await?.0)
}

/// A new lease for a held permit; whether it was held.
pub(crate) async fn permit_update(
    conn: &Conn,
    keys: &PermitKeys<'_>,
    id: &[u8],
    lease: Duration,
) -> Result<bool> {
    let call = keys
        .call(&PERMIT_UPDATE)
        .arg(conn.publish_command())
        .arg(id)
        .arg(lease.as_millis() as u64);
    Ok(int("permit update", run(call, conn, keys.name).await?.0)? == 1)
}

/// New leases for held permits, one call for all of `ids`; whether each was held.
pub(crate) async fn permit_renew(
    conn: &Conn,
    keys: &PermitKeys<'_>,
    ids: &[[u8; 16]],
    lease: Duration,
) -> Result<Vec<bool>> {
    let mut call = keys
        .call(&PERMIT_RENEW)
        .arg(conn.publish_command())
        .arg(lease.as_millis() as u64);
    for id in ids {
        call = call.arg(&id[..]);
    }
    let v = run(call, conn, keys.name).await?.0;
    let held: Vec<i64> =
        FromRedisValue::from_redis_value(v.clone()).map_err(|_| unexpected("permit renew", &v))?;
    if held.len() != ids.len() {
        return Err(unexpected("permit renew", &v));
    }
    Ok(held.into_iter().map(|h| h == 1).collect())
}

/// The available permits, after giving back those whose lease ended.
pub(crate) async fn permit_available(conn: &Conn, keys: &PermitKeys<'_>) -> Result<i64> {
    let call = keys.call(&PERMIT_AVAILABLE).arg(conn.publish_command());
    int("permit available", run(call, conn, keys.name).await?.0)
}

/// Counts the latch down by one; the count left.
pub(crate) async fn latch_count_down(conn: &Conn, name: &str, channel: &str) -> Result<i64> {
    let call = LATCH_COUNT_DOWN
        .call()
        .key(name)
        .key(channel)
        .arg(LATCH_ZERO_MESSAGE)
        .arg(conn.publish_command());
    int("latch count down", run(call, conn, name).await?.0)
}

/// Sets an absent latch's count; whether it was absent.
pub(crate) async fn latch_set(conn: &Conn, name: &str, channel: &str, n: u32) -> Result<bool> {
    let call = LATCH_SET
        .call()
        .key(name)
        .key(channel)
        .arg(LATCH_NEW_COUNT_MESSAGE)
        .arg(n)
        .arg(conn.publish_command());
    Ok(int("latch set", run(call, conn, name).await?.0)? == 1)
}

/// Deletes a semaphore's or latch's count and, for a permit-expirable semaphore, its
/// lease set; whether anything was there. `announce` is the latch's message, published
/// when its count was deleted.
pub(crate) async fn count_delete(
    conn: &Conn,
    name: &str,
    channel: &str,
    leases: Option<&str>,
    announce: Option<&str>,
) -> Result<bool> {
    let mut call = COUNT_DELETE.call().key(name).key(channel);
    if let Some(leases) = leases {
        call = call.key(leases);
    }
    let call = match announce {
        Some(message) => call.arg(conn.publish_command()).arg(message),
        None => call.arg("").arg(""),
    };
    Ok(int("delete", run(call, conn, name).await?.0)? == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_redisson_layout() {
        assert_eq!(semaphore_channel("jobs"), "redisson_sc:{jobs}");
        assert_eq!(semaphore_channel("{jobs}:x"), "redisson_sc:{jobs}:x");
        assert_eq!(permit_timeout_key("jobs"), "{jobs}:timeout");
        assert_eq!(permit_timeout_key("{jobs}:x"), "{jobs}:x:timeout");
        assert_eq!(
            latch_channel("{jobs}"),
            "redisson_countdownlatch__channel__{{jobs}}"
        );
        // A plain name keeps every key of its synchronizer in one slot.
        for aux in [
            semaphore_channel("jobs"),
            permit_timeout_key("jobs"),
            latch_channel("jobs"),
        ] {
            assert_eq!(key_slot(aux.as_bytes()), key_slot(b"jobs"));
        }
        assert!(check_name("{jobs}", true, &[&latch_channel("{jobs}")]).is_err());
        assert!(check_name("jobs", true, &[&latch_channel("jobs")]).is_ok());
    }
}
