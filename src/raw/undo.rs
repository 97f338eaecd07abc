//! Undoing a grant that no replica acknowledged (replica sync): an acquisition's, or a
//! hand-over's. Either is given back at once with the unlock script, published, so that
//! a failover cannot leave the lock with a holder the new master never heard of.

use std::time::Duration;

use super::{latch_key, release, request_id, AcquireCall, ReleaseCall};
use crate::connection::Conn;

/// Undoes the hold `call` took.
pub(super) async fn rollback(conn: &Conn, call: &AcquireCall<'_>) {
    let channel = call.kind.channel(call.name);
    let base = ReleaseCall {
        name: call.name,
        channel: &channel,
        token_key: call.token_key,
        latch: "",
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
    };
    give_back(conn, &base, call.field, "the acquisition").await
}

/// Undoes the hold the unlock `call` handed to `call.next`.
pub(super) async fn undo_handover(conn: &Conn, call: &ReleaseCall<'_>) {
    if let Some((field, _)) = call.next {
        give_back(conn, call, field, "a hand-over").await
    }
}

/// Releases `field`'s one hold on `base`'s lock. Best effort: if this fails too, the
/// hold ends with its lease.
async fn give_back(conn: &Conn, base: &ReleaseCall<'_>, field: &str, what: &str) {
    let latch = latch_key(base.name, &request_id());
    let undo = ReleaseCall {
        latch: &latch,
        field,
        next: None,
        keep: None,
        holds: 1,
        retry: false,
        turn_window: Duration::ZERO,
        gives_way: false,
        ..*base
    };
    // Boxed: `release` is what calls the undo of a hand-over.
    match Box::pin(release(conn, &undo)).await {
        Ok(r) => {
            tracing::warn!(lock = %base.name, outcome = ?r, "no replica acknowledged {what}; undone")
        }
        Err(e) => {
            tracing::warn!(lock = %base.name, error = %e, "no replica acknowledged {what}, and undoing it failed; the hold ends with its lease")
        }
    }
}
