//! The keys of the line in which clients of this crate wait for a plain lock, and of the
//! turn a published release gives the first of them (`docs/protocol.md` 2.6). The
//! acquire and unlock scripts use them; leaving the line is a plain command.

use super::prefixed;
use crate::error::{Error, Result};
use crate::wire::connection::Conn;

/// The clients of this crate waiting for the lock `name`, oldest first (one entry per
/// client id): `redisson_lock_clients:{<name>}`, or `redisson_lock_clients:<name>:t`
/// when the name carries its own hash tag. Ours; Redisson has no such key.
pub fn clients_key(name: &str) -> String {
    own_key(CLIENTS, name)
}

/// `prefixed`, made one-to-one: `a` and `{a}` share Redisson's keys and channel
/// (`<prefix>:{a}` for both), but each name has a line and a turn of its own. A name
/// with its own tag gets `:t` after it, so its key never ends in `}` as every other
/// name's does.
fn own_key(prefix: &str, name: &str) -> String {
    let mut key = prefixed(prefix, name);
    if crate::wire::slot::has_hash_tag(name.as_bytes()) {
        key.push_str(":t");
    }
    key
}

pub(crate) const CLIENTS: &str = "redisson_lock_clients";
pub(crate) const TURN: &str = "redisson_lock_turn";

/// The client whose turn it is to take the lock `name` after a published release:
/// `redisson_lock_turn:{<name>}` (`:t` after a name with its own tag, as
/// [`clients_key`]). Ours; Redisson has no such key.
pub fn turn_key(name: &str) -> String {
    own_key(TURN, name)
}

/// The message a published release sends on the lock's own channel, just before its
/// unlock message, when it gives the client `client_id` the turn: 2^48 plus the number
/// its first 12 hex digits spell (the uuid's first two groups), in decimal. An integer,
/// because Redisson's subscribers decode every message on the channel as one and act
/// only on `0` and `1`; at least 2^48, so it is never `0`, `1` or
/// [`FORCE_UNLOCK_EVENT`](super::FORCE_UNLOCK_EVENT). `None` for an id that does not
/// begin with 8 and 4 hex digits (no client of this crate has one). Two clients whose ids
/// share those 48 bits would each take the other's turn for its own: a wasted attempt,
/// never a grant.
pub fn turn_message(client_id: &str) -> Option<String> {
    let bits = client_id.get(..8)?.to_owned() + client_id.get(9..13)?;
    let n = u64::from_str_radix(&bits, 16).ok()?;
    (bits.len() == 12 && bits.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| (TURN_BASE + n).to_string())
}

const TURN_BASE: u64 = 1 << 48;
/// A turn message from here on also asks its client to let a subscriber from outside the
/// line try first: `YIELD_BASE` + the 48 bits (`lua/published.lua`).
const YIELD_BASE: u64 = 1 << 49;

/// What a message on a plain lock's channel is, to a client of this crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TurnMessage {
    /// A turn given to the client whose turn number this is (see [`turn_message`]);
    /// `yields`: the release saw a subscriber outside the line (a Redisson waiter, most
    /// likely), whom the client lets try first.
    Turn { client: u64, yields: bool },
    /// The event a force unlock announces before its unlock message.
    ForceEvent,
    /// Anything else: an unlock message (`0`, `1`) or a message no unlock of ours sent.
    Other,
}

impl TurnMessage {
    pub(crate) fn of(payload: &[u8]) -> TurnMessage {
        if payload == super::FORCE_UNLOCK_EVENT.as_bytes() {
            return TurnMessage::ForceEvent;
        }
        let n = std::str::from_utf8(payload)
            .ok()
            .and_then(|s| s.parse::<u64>().ok());
        match n {
            Some(n) if (TURN_BASE..YIELD_BASE).contains(&n) => TurnMessage::Turn {
                client: n,
                yields: false,
            },
            Some(n) if (YIELD_BASE..YIELD_BASE + TURN_BASE).contains(&n) => TurnMessage::Turn {
                client: n - TURN_BASE,
                yields: true,
            },
            _ => TurnMessage::Other,
        }
    }

    /// The turn number of `client_id`, as [`TurnMessage::Turn`] carries it in `client`.
    pub(crate) fn number_of(client_id: &str) -> Option<u64> {
        turn_message(client_id).and_then(|m| m.parse().ok())
    }
}

/// Takes this client (`client_id`) out of the line for the lock `name`: its last waiter
/// stopped waiting without the lock.
pub(crate) async fn leave_line(conn: &Conn, name: &str, client_id: &str) -> Result<()> {
    let mut cmd = redis::cmd("LREM");
    cmd.arg(clients_key(name)).arg(0).arg(client_id);
    conn.query(&cmd)
        .await
        .map(|_| ())
        .map_err(|e| conn.error(e, name))
}

/// The lock's PTTL in ms: `-2` when it is free, `-1` when it has no expiry. A plain
/// command: a waiter woken by a turn's end looks before it tries.
pub(crate) async fn lock_pttl(conn: &Conn, name: &str) -> Result<i64> {
    let reply = super::query(conn, name, redis::cmd("PTTL").arg(name).clone()).await?;
    redis::from_redis_value(reply).map_err(|e| Error::Redis(e.into()))
}
