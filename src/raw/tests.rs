//! Unit tests of the key layout and request ids.

use super::*;

#[test]
fn request_ids_are_the_prefix_and_a_hex_count() {
    let a = request_id();
    let b = request_id();
    let (pa, na) = a.rsplit_once('-').unwrap();
    let (pb, nb) = b.rsplit_once('-').unwrap();
    assert_eq!(pa, pb);
    assert_eq!(pa.len(), 32);
    let (na, nb) = (
        u64::from_str_radix(na, 16).unwrap(),
        u64::from_str_radix(nb, 16).unwrap(),
    );
    assert!(nb > na, "{a} then {b}");
    assert_eq!(format!("{pa}-{na:x}"), a);
}

#[test]
fn channel_follows_redisson_layout() {
    assert_eq!(
        channel_name("orders:42"),
        "redisson_lock__channel:{orders:42}"
    );
    assert_eq!(
        channel_name("{user1}:cart"),
        "redisson_lock__channel:{user1}:cart"
    );
}

#[test]
fn prefixed_keys_keep_a_names_own_hash_tag() {
    assert_eq!(prefixed("p", "x{t}y"), "p:x{t}y");
    assert_eq!(prefixed("p", "n"), "p:{n}");
    assert_eq!(prefixed("p", "a{b"), "p:{a{b}");
}
