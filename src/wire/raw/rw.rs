//! The read-write lock's calls (Redisson's `RReadWriteLock` layout): its keys, and the
//! scripts that differ from a plain lock's.

use std::time::Duration;

use super::{flag, ms, prefixed, AcquireCall, Kind, ReleaseCall};
use crate::error::Result;
use crate::wire::connection::Conn;
use crate::wire::scripts::{
    ScriptCall, READ_ACQUIRE, READ_RENEW, READ_UNLOCK, RW_FORCE_UNLOCK, WRITE_ACQUIRE, WRITE_UNLOCK,
};
use crate::wire::slot::has_hash_tag;

/// The message a write unlock publishes on a read-write lock's channel (Redisson's
/// `LockPubSub.READ_UNLOCK_MESSAGE`): every waiter may try, since readers share. The
/// last reader's unlock publishes [`UNLOCK_MESSAGE`](super::UNLOCK_MESSAGE) (`"0"`).
pub const READ_UNLOCK_MESSAGE: &str = "1";

/// What every read-write lock's channel starts with.
pub(crate) const RW_CHANNEL_PREFIX: &str = "redisson_rwlock:";

/// The pub/sub channel of the read-write lock `name`: `redisson_rwlock:{<name>}`, shared
/// by its readers and writers.
pub fn rw_channel_name(name: &str) -> String {
    prefixed(RW_CHANNEL_PREFIX.trim_end_matches(':'), name)
}

/// `{<name>}`, or `<name>` when the name carries its own hash tag: what every read hold's
/// timeout key starts with (Redisson's `suffixName` without the suffix).
fn key_prefix(name: &str) -> String {
    if has_hash_tag(name.as_bytes()) {
        name.to_string()
    } else {
        format!("{{{name}}}")
    }
}

/// The timeout keys of one reader's holds, without the hold number:
/// `{<name>}:<field>:rwlock_timeout` (hold `n` is `<prefix>:<n>`).
pub(crate) fn timeout_prefix(name: &str, field: &str) -> String {
    format!("{}:{field}:rwlock_timeout", key_prefix(name))
}

use crate::policy::wait::RW_MARK;

/// The writers of this crate that wait: `redisson_rwlock_writers:{<name>}` (this crate's
/// own key; Redisson's readers do not look at it), a sorted set of write fields scored by
/// when each one's mark ends. New readers of this crate wait while any mark is live.
pub fn writer_key(name: &str) -> String {
    prefixed("redisson_rwlock_writers", name)
}

pub(super) fn acquire_call(call: &AcquireCall<'_>) -> ScriptCall {
    if call.kind == Kind::Read {
        READ_ACQUIRE
            .call()
            .key(call.name)
            .key(timeout_prefix(call.name, call.field))
            .key(call.latch)
            .key(writer_key(call.name))
            .key(reader_key(call.name))
            .key(read_turn_key(call.name))
            .arg(ms(call.lease))
            .arg(call.field)
            .arg(ms(call.latch_ttl).max(1))
            .arg(flag(call.fresh))
            .arg(flag(call.retry))
            .arg(flag(call.waits))
            .arg(ms(RW_MARK))
    } else {
        WRITE_ACQUIRE
            .call()
            .key(call.name)
            .key(call.latch)
            .key(writer_key(call.name))
            .key(read_turn_key(call.name))
            .arg(ms(call.lease))
            .arg(call.field)
            .arg(ms(call.latch_ttl).max(1))
            .arg(flag(call.fresh))
            .arg(flag(call.retry))
            .arg(flag(call.waits))
            .arg(ms(RW_MARK))
    }
}

/// The readers of this crate that wait: `redisson_rwlock_readers:{<name>}` (this crate's
/// own key), scored as [`writer_key`]'s. A writer's last unlock that finds a live mark
/// there starts the readers' turn for them.
pub fn reader_key(name: &str) -> String {
    prefixed("redisson_rwlock_readers", name)
}

/// The readers' turn after a writer: `redisson_rwlock_turn:{<name>}` (this crate's own
/// key), the waiting readers the writer's unlock found. While it lasts, new readers of
/// this crate pass a waiting writer's mark and new writers wait; it ends when each
/// reader it names has been granted, or after 50 ms at most.
pub fn read_turn_key(name: &str) -> String {
    prefixed("redisson_rwlock_turn", name)
}

/// How long a readers' turn lasts at most: readers that keep coming may hold a waiting
/// writer back this long.
pub(crate) const READ_TURN: Duration = Duration::from_millis(50);

/// Clears the mark of a waiter of `kind` with holder `field` (a writer's ends in
/// `:write`): it stopped waiting without the lock. A reader also leaves a turn made for
/// it, which would otherwise keep writers out until the turn runs out.
pub(crate) async fn clear_mark(conn: &Conn, name: &str, field: &str, kind: Kind) -> Result<()> {
    let keys = if kind == Kind::Write {
        vec![writer_key(name)]
    } else {
        vec![reader_key(name), read_turn_key(name)]
    };
    for key in keys {
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(key).arg(field);
        conn.query(&cmd).await.map_err(|e| conn.error(e, name))?;
    }
    Ok(())
}

/// A read-write lock never hands over: `call.next` is not sent.
pub(super) fn release_call(conn: &Conn, call: &ReleaseCall<'_>) -> ScriptCall {
    if call.kind == Kind::Read {
        READ_UNLOCK
            .call()
            .key(call.name)
            .key(call.channel)
            .key(call.latch)
            .key(timeout_prefix(call.name, call.field))
            .key(key_prefix(call.name))
            .arg(super::UNLOCK_MESSAGE)
            .arg(call.field)
            .arg(ms(call.latch_ttl).max(1))
            .arg(conn.publish_command())
            .arg(call.holds)
            .arg(flag(call.retry))
    } else {
        WRITE_UNLOCK
            .call()
            .key(call.name)
            .key(call.channel)
            .key(call.latch)
            .key(reader_key(call.name))
            .key(read_turn_key(call.name))
            .arg(READ_UNLOCK_MESSAGE)
            .arg(call.keep.map(ms).unwrap_or(0))
            .arg(call.field)
            .arg(ms(call.latch_ttl).max(1))
            .arg(conn.publish_command())
            .arg(call.holds)
            .arg(flag(call.retry))
            .arg(ms(READ_TURN))
    }
}

/// Renews a batch of read holds `(name, field)`, their timeout keys with them;
/// `true` where the lease was extended.
pub(crate) async fn renew_read(
    conn: &Conn,
    batch: &[(&str, &str)],
    lease: Duration,
) -> Result<Vec<bool>> {
    let mut call = READ_RENEW.call();
    for (name, field) in batch {
        call = call.key(name).key(timeout_prefix(name, field));
    }
    super::renewed(call, conn, batch, lease, "read renew").await
}

/// Deletes the read-write lock `name` if it is in the mode of `kind` (Redisson's
/// `forceUnlock` of its read or write lock). Returns whether it was deleted.
pub(crate) async fn force_release_rw(
    conn: &Conn,
    name: &str,
    channel: &str,
    kind: Kind,
) -> Result<bool> {
    let (mode, message) = match kind {
        Kind::Write => ("write", READ_UNLOCK_MESSAGE),
        _ => ("read", super::UNLOCK_MESSAGE),
    };
    let call = RW_FORCE_UNLOCK
        .call()
        .key(name)
        .key(channel)
        .arg(mode)
        .arg(message)
        .arg(conn.publish_command())
        .arg(super::FORCE_UNLOCK_EVENT);
    super::one_or_zero(call, conn, name, "force unlock").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_redisson_layout() {
        assert_eq!(rw_channel_name("doc:1"), "redisson_rwlock:{doc:1}");
        assert_eq!(timeout_prefix("doc:1", "u:7"), "{doc:1}:u:7:rwlock_timeout");
        assert_eq!(timeout_prefix("{t}doc", "u:7"), "{t}doc:u:7:rwlock_timeout");
    }
}
