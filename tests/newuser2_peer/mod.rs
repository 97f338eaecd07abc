//! Helpers of `tests/newuser2*.rs`: a Java service's lock through Redisson's own scripts
//! (`tests/common/redisson_rlock.rs`), and the keys left without a TTL.

use crate::common::redisson_waiter::{acquire, unlock};
use crate::common::RedisServer;

pub const JAVA_FIELD: &str = "0a0b0c0d-2222-3333-4444-555566667777:42";

pub fn java_acquire(s: &RedisServer, name: &str, lease_ms: u64) -> Option<i64> {
    acquire(&mut s.conn(), name, lease_ms, JAVA_FIELD)
}

pub fn java_unlock(s: &RedisServer, name: &str, request: u32) -> Option<i64> {
    unlock(&mut s.conn(), name, &format!("{request:04x}"), JAVA_FIELD)
}

/// Keys without a TTL other than `lock_names`: anything of ours beyond Redisson's hash
/// must expire (PTTL -1 is none; -2, gone since `KEYS`, is fine).
pub fn keys_without_ttl(s: &RedisServer, lock_names: &[&str]) -> Vec<String> {
    let keys: Vec<String> = s.cmd(&["KEYS", "*"]);
    keys.into_iter()
        .filter(|k| !lock_names.contains(&k.as_str()))
        .filter(|k| s.cmd::<i64>(&["PTTL", k]) == -1)
        .collect()
}
