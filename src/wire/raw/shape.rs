//! What a lock's hash looks like: the rule that tells a lock from application data.
//! `lua/lock_shape.lua` applies the same rule inside the scripts.
//!
//! A hash is a lock when it has at least one holder and nothing else but a read-write
//! lock's `mode` (`read` or `write`). A holder is a field `<uuid>:<owner>` whose value is
//! a positive hold count, where the uuid is 36 characters of a hyphenated UUID and the
//! owner one of the forms Redisson and this crate write: a thread id (digits, with a
//! minus sign for an explicit negative id), `thread-<n>` or `scope-<n>`; a writer's field
//! ends in `:write`.

/// Whether a hash field has the shape of a lock holder's (see the module's rule).
pub fn is_holder_field(field: &str) -> bool {
    let bytes = field.as_bytes();
    if bytes.len() < 38 || bytes[36] != b':' || !is_uuid(&bytes[..36]) {
        return false;
    }
    let owner = &field[37..];
    let owner = owner.strip_suffix(":write").unwrap_or(owner);
    let number = owner
        .strip_prefix("thread-")
        .or_else(|| owner.strip_prefix("scope-"))
        .unwrap_or_else(|| owner.strip_prefix('-').unwrap_or(owner));
    !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit())
}

fn is_uuid(bytes: &[u8]) -> bool {
    bytes.iter().enumerate().all(|(i, b)| match i {
        8 | 13 | 18 | 23 => *b == b'-',
        _ => b.is_ascii_hexdigit(),
    })
}

/// Whether a hash with these fields and values is a lock (see the module's rule). An
/// empty hash is none: Redis has no empty hashes, so it stands for a key that is gone.
pub fn is_lock_hash<F: AsRef<[u8]>, V: AsRef<[u8]>>(entries: &[(F, V)]) -> bool {
    let mut holders = 0;
    for (field, value) in entries {
        let (field, value) = (field.as_ref(), value.as_ref());
        if field == b"mode" {
            if value != b"read" && value != b"write" {
                return false;
            }
        } else if std::str::from_utf8(field).is_ok_and(is_holder_field) && is_count(value) {
            holders += 1;
        } else {
            return false;
        }
    }
    holders > 0
}

fn is_count(value: &[u8]) -> bool {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "6f1c1a52-3c1e-4d8a-9b7e-0a1b2c3d4e5f";

    #[test]
    fn holders_have_the_owner_forms_that_are_written() {
        for owner in [
            "7",
            "-7",
            "thread-2",
            "scope-3",
            "7:write",
            "thread-2:write",
        ] {
            assert!(is_holder_field(&format!("{ID}:{owner}")), "{owner}");
        }
        for owner in [
            "", "items", "7x", "thread-", "scope-x", ":write", "7:read", "- 7",
        ] {
            assert!(!is_holder_field(&format!("{ID}:{owner}")), "{owner:?}");
        }
        assert!(!is_holder_field("6f1c1a52-3c1e-4d8a-9b7e-0a1b2c3d4e5g:7"));
    }

    #[test]
    fn a_lock_hash_has_counts_and_a_mode_of_read_or_write() {
        let holder = format!("{ID}:7");
        assert!(is_lock_hash(&[(holder.as_str(), "1")]));
        assert!(is_lock_hash(&[("mode", "read"), (holder.as_str(), "2")]));
        assert!(!is_lock_hash(&[(holder.as_str(), "{\"sku\":42}")]));
        assert!(!is_lock_hash(&[(holder.as_str(), "0")]));
        assert!(!is_lock_hash(&[("mode", "read")]));
        assert!(!is_lock_hash(&[("mode", "open"), (holder.as_str(), "1")]));
        assert!(!is_lock_hash(&[(holder.as_str(), "1"), ("title", "x")]));
        assert!(!is_lock_hash::<&str, &str>(&[]));
        assert!(!is_lock_hash(&[(&b"\xff\xfe"[..], &b"1"[..])]));
    }
}
