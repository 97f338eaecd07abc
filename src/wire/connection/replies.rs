//! What the replies of replica sync say: `WAIT`'s count, and `ROLE`'s replicas.

use redis::Value;

/// What the replica sync of one write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Synced {
    /// Sync is off, or there is no replica to wait for: nothing was asked.
    NotAsked,
    /// This many replicas acknowledged the write within the timeout.
    Acked(i64),
}

/// `Some(number of replicas)` when a `ROLE` reply says "master".
pub(super) fn parse_master_role(v: &Value) -> Option<usize> {
    let Value::Array(items) = v else { return None };
    let role = match items.first()? {
        Value::BulkString(b) => b.as_slice(),
        Value::SimpleString(s) => s.as_bytes(),
        _ => return None,
    };
    if role != b"master" {
        return None;
    }
    match items.get(2) {
        Some(Value::Array(replicas)) => Some(replicas.len()),
        _ => Some(0),
    }
}
