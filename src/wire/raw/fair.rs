//! The fair lock's calls (Redisson's `RFairLock` layout): its queue keys, each waiter's
//! channel, and the scripts that differ from a plain lock's (`docs/protocol.md` 8).

use std::time::Duration;

use super::{flag, ms, prefixed, AcquireCall, ReleaseCall, UNLOCK_MESSAGE};
use crate::error::Result;
use crate::wire::connection::Conn;
use crate::wire::scripts::{ScriptCall, FAIR_ACQUIRE, FAIR_LEAVE, FAIR_UNLOCK};

/// The fair lock's queue of waiting holder fields: `redisson_lock_queue:{<name>}`.
pub fn queue_key(name: &str) -> String {
    prefixed("redisson_lock_queue", name)
}

/// Each waiter's deadline: `redisson_lock_timeout:{<name>}`.
pub fn timeout_key(name: &str) -> String {
    prefixed("redisson_lock_timeout", name)
}

/// The channel on which the waiter `field` of the fair lock `name` hears that it is first
/// in line and the lock is free: `redisson_lock__channel:{<name>}:<field>`.
pub(crate) fn waiter_channel(name: &str, field: &str) -> String {
    format!("{}:{field}", super::channel_name(name))
}

pub(super) fn acquire_call(call: &AcquireCall<'_>) -> ScriptCall {
    FAIR_ACQUIRE
        .call()
        .key(call.name)
        .key(queue_key(call.name))
        .key(timeout_key(call.name))
        .key(call.latch)
        .arg(ms(call.lease))
        .arg(call.field)
        .arg(ms(call.fair_wait))
        .arg(ms(call.latch_ttl).max(1))
        .arg(flag(call.fresh))
        .arg(flag(call.retry))
        .arg(flag(call.waits))
}

/// A fair lock never hands over: `call.next` is not sent.
pub(super) fn release_call(conn: &Conn, call: &ReleaseCall<'_>) -> ScriptCall {
    FAIR_UNLOCK
        .call()
        .key(call.name)
        .key(queue_key(call.name))
        .key(timeout_key(call.name))
        .key(call.latch)
        .arg(UNLOCK_MESSAGE)
        .arg(call.keep.map(ms).unwrap_or(0))
        .arg(call.field)
        .arg(ms(call.latch_ttl).max(1))
        .arg(conn.publish_command())
        .arg(call.holds)
        .arg(flag(call.retry))
        .arg(call.channel)
}

/// Takes `field` (if any) out of the queue of the fair lock `name` (the waiters behind it
/// move one place up, their deadlines too), deletes the lock if `delete` (a force
/// unlock), and tells the waiter then first in line if the lock is free. Returns whether
/// a lock was deleted.
pub(crate) async fn fair_leave(
    conn: &Conn,
    name: &str,
    field: Option<&str>,
    delete: bool,
    wait: Duration,
) -> Result<bool> {
    let call = FAIR_LEAVE
        .call()
        .key(name)
        .key(queue_key(name))
        .key(timeout_key(name))
        .arg(field.unwrap_or(""))
        .arg(flag(delete))
        .arg(UNLOCK_MESSAGE)
        .arg(conn.publish_command())
        .arg(super::channel_name(name))
        .arg(super::FORCE_UNLOCK_EVENT)
        .arg(ms(wait));
    super::one_or_zero(call, conn, name, "fair leave").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_redisson_layout() {
        assert_eq!(queue_key("job:1"), "redisson_lock_queue:{job:1}");
        assert_eq!(timeout_key("job:1"), "redisson_lock_timeout:{job:1}");
        assert_eq!(
            waiter_channel("job:1", "u:7"),
            "redisson_lock__channel:{job:1}:u:7"
        );
    }
}
