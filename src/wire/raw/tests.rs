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
fn fresh_latches_are_the_prefix_the_name_and_a_request_id() {
    for (name, tagged) in [("orders:42", "{orders:42}"), ("{u1}:cart", "{u1}:cart")] {
        for (key, prefix) in [
            (fresh_latch_key(name), "redisson_unlock_latch"),
            (fresh_acquire_latch_key(name), "redisson_unlock_latch"),
        ] {
            let (head, id) = key.rsplit_once(':').unwrap();
            assert_eq!(head, format!("{prefix}:{tagged}"));
            let (pid, n) = id.split_once('-').unwrap();
            assert_eq!(pid.len(), 32, "{key}");
            assert!(u64::from_str_radix(n, 16).is_ok(), "{key}");
        }
    }
    assert_ne!(fresh_latch_key("a"), fresh_latch_key("a"));
    assert_ne!(fresh_acquire_latch_key("a"), fresh_latch_key("a"));
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

/// Issue 24, finding 3: `a` and `{a}` share Redisson's keys and channel, but not the
/// line or the turn; every key stays in the name's slot, and the scripts' key builder
/// writes the same keys as the public functions.
#[test]
fn a_name_and_its_braced_twin_have_their_own_line_and_turn() {
    for (a, b) in [("t3", "{t3}"), ("a}", "{a}}"), ("x", "{x}")] {
        assert_eq!(channel_name(a), channel_name(b));
        assert_ne!(clients_key(a), clients_key(b));
        assert_ne!(turn_key(a), turn_key(b));
    }
    assert_eq!(clients_key("t3"), "redisson_lock_clients:{t3}");
    assert_eq!(clients_key("{t3}"), "redisson_lock_clients:{t3}:t");
    for name in ["t3", "{t3}", "orders{42}", "a{b"] {
        let slot = crate::wire::slot::key_slot(name.as_bytes());
        for key in [clients_key(name), turn_key(name)] {
            assert_eq!(crate::wire::slot::key_slot(key.as_bytes()), slot, "{key}");
        }
        let built = crate::wire::scripts::ACQUIRE
            .call()
            .key_own(turns::CLIENTS, name)
            .key_own(turns::TURN, name)
            .keys_as_text();
        assert_eq!(built, [clients_key(name), turn_key(name)]);
    }
}

/// A turn message is an integer Redisson's subscribers ignore (neither `0` nor `1`), tells
/// clients apart by their id's first 48 bits, and is never the force unlock's event.
#[test]
fn turn_messages_are_integers_of_their_own_range() {
    let id = "5f90d60b-db4d-4f3a-a845-e19f55a73e88";
    let m = turn_message(id).unwrap();
    assert_eq!(m, ((1u64 << 48) + 0x5f90_d60b_db4d).to_string());
    assert_eq!(
        TurnMessage::of(m.as_bytes()),
        TurnMessage::Turn {
            client: m.parse().unwrap(),
            yields: false
        }
    );
    // The same turn, asking the client to let a subscriber outside the line go first.
    let yielding = (m.parse::<u64>().unwrap() + (1 << 48)).to_string();
    assert_eq!(
        TurnMessage::of(yielding.as_bytes()),
        TurnMessage::Turn {
            client: m.parse().unwrap(),
            yields: true
        }
    );
    assert_eq!(TurnMessage::number_of(id), Some(m.parse().unwrap()));
    let other = turn_message("5f90d60b-db4e-4f3a-a845-e19f55a73e88").unwrap();
    assert_ne!(m, other);
    for low in [
        "ffffffff-ffff-4fff-8fff-ffffffffffff",
        "00000000-0000-4000-8000-000000000000",
    ] {
        let n: u64 = turn_message(low).unwrap().parse().unwrap();
        assert!((1 << 48..1 << 49).contains(&n), "{n}");
    }
    for bad in [
        "",
        "5f90d60b",
        "5f90d60b-db4",
        "+f90d60b-db4d-4f3a",
        "5f90d60g-db4d-4f3a",
    ] {
        assert_eq!(turn_message(bad), None, "{bad:?}");
    }
    for other in ["0", "1", FORCE_UNLOCK_EVENT, "taken", "844424930131968"] {
        assert!(
            !matches!(TurnMessage::of(other.as_bytes()), TurnMessage::Turn { .. }),
            "{other}"
        );
    }
    assert_eq!(
        TurnMessage::of(FORCE_UNLOCK_EVENT.as_bytes()),
        TurnMessage::ForceEvent
    );
}
