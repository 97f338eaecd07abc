//! Redis Cluster key slots: CRC16 (XMODEM) of the key's hash tag, modulo 16384.
//!
//! The crate needs slots for three things: checking that a lock's auxiliary keys land in
//! the lock's own slot, grouping batched renewals and latch deletions so that every
//! multi-key command stays within one slot, and sending `WAIT` to the node that ran a
//! script.

/// Number of slots in a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// The part of `key` that Redis hashes: the text between the first `{` and the next `}`
/// when that is not empty, else the whole key.
pub(crate) fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// True when `key` carries a hash tag that Redis honours.
pub(crate) fn has_hash_tag(key: &[u8]) -> bool {
    hash_tag(key).len() != key.len()
}

/// The cluster slot of `key`.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOTS
}

/// CRC-16/XMODEM: polynomial 0x1021, initial value 0, no reflection.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= (byte as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values printed by CLUSTER KEYSLOT on Redis 7.0.
        assert_eq!(key_slot(b"lock:a"), 6035);
        assert_eq!(key_slot(b"lock:b"), 10224);
        assert_eq!(key_slot(b"{lock}:a"), 8718);
        assert_eq!(key_slot(b"{lock}:b"), 8718);
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"123456789"), 0x31C3 % SLOTS);
    }

    #[test]
    fn empty_tag_hashes_whole_key() {
        assert_eq!(hash_tag(b"{}a"), b"{}a");
        assert!(!has_hash_tag(b"{}a"));
        assert!(has_hash_tag(b"x{y}"));
        assert!(!has_hash_tag(b"a{b"));
    }
}
