//! Force unlock: the script call, and the event it announces to observers.

use crate::connection::Conn;
use crate::error::Result;
use crate::scripts::FORCE_UNLOCK;

use super::{one_or_zero, prefixed, UNLOCK_MESSAGE};

/// This crate's event channel of the lock `name`: `rlock_events:{<name>}`. A force unlock
/// publishes `force-unlock` there, so that an observer (`rlock watch`) can tell it from a
/// release. No Redisson client listens to it, and nothing is stored under it.
pub fn events_channel(name: &str) -> String {
    prefixed("rlock_events", name)
}

/// The message a force unlock publishes on [`events_channel`].
pub const FORCE_UNLOCK_EVENT: &str = "force-unlock";

pub(crate) async fn force_release(conn: &Conn, name: &str, channel: &str) -> Result<bool> {
    let call = FORCE_UNLOCK
        .call()
        .key(name)
        .key(channel)
        .key(events_channel(name))
        .arg(UNLOCK_MESSAGE)
        .arg(conn.publish_command());
    one_or_zero(call, conn, name, "force unlock").await
}
