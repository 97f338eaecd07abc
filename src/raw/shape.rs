//! What a lock's hash looks like: the rule that tells a lock from application data
//! (`lua/lock_shape.lua` applies the same rule inside the scripts).

/// Whether a hash field has the shape of a lock holder's: `<client uuid>:<owner id>`,
/// as this crate and Redisson write it (a writer's ends in `:write`). A hash is a lock
/// only when it has at least one such field and no other field than a read-write lock's
/// `mode` (`lua/lock_shape.lua` applies the same rule inside the scripts).
pub fn is_holder_field(field: &str) -> bool {
    let bytes = field.as_bytes();
    bytes.len() > 37
        && bytes[36] == b':'
        && bytes[..36].iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}
