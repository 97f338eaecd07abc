//! The keys of the line in which clients of this crate wait for a plain lock, and of the
//! turn a published release gives the first of them (`docs/protocol.md` 2.6). The
//! acquire and unlock scripts use them; leaving the line is a plain command.

use super::prefixed;
use crate::connection::Conn;
use crate::error::{Error, Result};

/// The clients of this crate waiting for the lock `name`, oldest first (one entry per
/// client id): `redisson_lock_clients:{<name>}`, or `redisson_lock_clients:<name>:t`
/// when the name carries its own hash tag. Ours; Redisson has no such key.
pub fn clients_key(name: &str) -> String {
    own_key(CLIENTS, name)
}

/// `prefixed`, made one-to-one: `a` and `{a}` share Redisson's keys and channel
/// (`<prefix>:{a}` for both), but each name has a line and a turn of its own. A name
/// with its own tag gets `:t` after it, so its key never ends in `}` as every other
/// name's does.
fn own_key(prefix: &str, name: &str) -> String {
    let mut key = prefixed(prefix, name);
    if crate::slot::has_hash_tag(name.as_bytes()) {
        key.push_str(":t");
    }
    key
}

pub(crate) const CLIENTS: &str = "redisson_lock_clients";
pub(crate) const TURN: &str = "redisson_lock_turn";
pub(crate) const TURNS: &str = "redisson_lock_turns";

/// The client whose turn it is to take the lock `name` after a published release:
/// `redisson_lock_turn:{<name>}` (`:t` after a name with its own tag, as
/// [`clients_key`]). Ours; Redisson has no such key.
pub fn turn_key(name: &str) -> String {
    own_key(TURN, name)
}

/// This crate's channel on which a published release names the client whose turn it
/// is, just before the unlock message: `redisson_lock_turns:{<name>}` (`:t` after a
/// name with its own tag, as [`clients_key`]). Ours; Redisson never subscribes to it.
pub fn turns_channel(name: &str) -> String {
    own_key(TURNS, name)
}

/// Whether `channel` is a turns channel (see [`turns_channel`]).
pub(crate) fn is_turns_channel(channel: &str) -> bool {
    channel.starts_with("redisson_lock_turns:")
}

/// Takes this client (`client_id`) out of the line for the lock `name`: its last waiter
/// stopped waiting without the lock.
pub(crate) async fn leave_line(conn: &Conn, name: &str, client_id: &str) -> Result<()> {
    let mut cmd = redis::cmd("LREM");
    cmd.arg(clients_key(name)).arg(0).arg(client_id);
    conn.query(&cmd)
        .await
        .map(|_| ())
        .map_err(|e| conn.error(e, name))
}

/// The lock's PTTL in ms: `-2` when it is free, `-1` when it has no expiry. A plain
/// command: a waiter woken by a turn's end looks before it tries.
pub(crate) async fn lock_pttl(conn: &Conn, name: &str) -> Result<i64> {
    let reply = super::query(conn, name, redis::cmd("PTTL").arg(name).clone()).await?;
    redis::from_redis_value(reply).map_err(|e| Error::Redis(e.into()))
}
