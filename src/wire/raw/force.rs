//! Force unlock: the script call, and the event it announces to observers.

use crate::error::Result;
use crate::wire::connection::Conn;
use crate::wire::scripts::FORCE_UNLOCK;

use super::{one_or_zero, UNLOCK_MESSAGE};

/// The message a force unlock publishes on the lock's own channel just before its
/// unlock message, so that an observer (`rlock watch`) can tell it from a release:
/// 2^48 - 1. An integer, because Redisson's subscribers decode every message on a lock
/// channel as one and act only on `0` and `1`; below every turn message
/// ([`turn_message`](super::turn_message)). A read-write lock's force unlock publishes it
/// on its channel, a fair lock's on `redisson_lock__channel:{<name>}`.
pub const FORCE_UNLOCK_EVENT: &str = "281474976710655";

pub(crate) async fn force_release(conn: &Conn, name: &str, channel: &str) -> Result<bool> {
    let call = FORCE_UNLOCK
        .call()
        .key(name)
        .key(channel)
        .arg(UNLOCK_MESSAGE)
        .arg(conn.publish_command())
        .arg(FORCE_UNLOCK_EVENT);
    one_or_zero(call, conn, name, "force unlock").await
}
