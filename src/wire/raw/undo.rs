//! Undoing an acquisition that no replica acknowledged (replica sync), so that a
//! failover cannot leave the lock with a holder the new master never heard of. (A
//! hand-over no replica acknowledged is given back by the waiter it was handed to:
//! `Release::HandedOver::unacked`.)

use std::time::Duration;

use super::{latch_key, release, request_id, AcquireCall, ReleaseCall, ATTEMPTS, LATE_COPIES};
use crate::wire::connection::Conn;

/// Releases the hold `call` took, published, with no hand-over. Best effort: if this
/// fails too, the hold ends with its lease.
pub(super) async fn rollback(conn: &Conn, call: &AcquireCall<'_>) {
    let latch = latch_key(call.name, &request_id());
    let channel = call.kind.channel(call.name);
    let mut undo = ReleaseCall {
        name: call.name,
        channel: &channel,
        token_key: call.token_key,
        latch: &latch,
        field: call.field,
        next: None,
        keep: None,
        holds: 1,
        latch_ttl: call.latch_ttl,
        retry: false,
        fenced: call.fenced,
        kind: call.kind,
        turn_window: Duration::ZERO,
        gives_way: false,
        ends_run: false,
        // Without turns (no window) the release reads no line.
        listens: true,
    };
    let mut attempt = 0;
    // Sent again with the same request id when its reply may be lost, as an unlock is: a
    // retry leaves its outcome in the latch, where a late copy of an earlier send finds
    // it instead of releasing a newer hold of the field (`unlock.lua`).
    let outcome = loop {
        attempt += 1;
        match Box::pin(release(conn, &undo)).await {
            Err(e) if e.may_have_run() && attempt < ATTEMPTS => {
                undo.retry = true;
                undo.latch_ttl = undo.latch_ttl.max(LATE_COPIES);
                tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
            }
            r => break r,
        }
    };
    match outcome {
        Ok(r) => {
            tracing::warn!(lock = %call.name, outcome = ?r, "no replica acknowledged the acquisition; rolled back")
        }
        Err(e) => {
            tracing::warn!(lock = %call.name, error = %e, "no replica acknowledged the acquisition, and the rollback failed; the hold ends with its lease")
        }
    }
}
