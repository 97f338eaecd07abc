//! The plain lock's calls, one script per intent (`docs/protocol.md` 2.1, 2.1a, 2.2,
//! 2.2a): a first send that needs no more goes to the small `lua/take.lua` or
//! `lua/release.lua`; a retry, a fenced grant, a client in line or a hand-over to the
//! general `lua/acquire.lua` or `lua/unlock.lua`, with their flags.

use super::flags::{Flags, Line};
use super::{ms, turns, AcquireCall, ReleaseCall};
use crate::wire::connection::Conn;
use crate::wire::scripts::{ScriptCall, ACQUIRE, RELEASE, RELEASE_SHARDED, TAKE, UNLOCK};

/// The acquire of a plain lock.
pub(super) fn acquire_call(call: &AcquireCall<'_>) -> ScriptCall {
    if takes(call) {
        return take_call(call);
    }
    let script = ACQUIRE.call().key(call.name).key(call.latch);
    with_line(script, call.name)
        .key_if(call.fenced, call.token_key)
        .arg(ms(call.lease))
        .arg(call.field)
        .arg(ms(call.latch_ttl).max(1))
        .arg(ms(call.turn_window))
        .arg(
            Flags::new()
                .set(b'f', call.fresh)
                .set(b'r', call.retry)
                .set(b'F', call.fenced)
                .set(b'w', call.waits)
                .line(call.line),
        )
}

/// Whether the call is `lua/take.lua`'s: a plain lock's first send of a field the
/// client knows no hold of, unfenced, by a client not in the lock's line.
fn takes(call: &AcquireCall<'_>) -> bool {
    call.fresh && !call.retry && !call.fenced && call.line == Line::Out
}

/// `lua/take.lua`: the lock, and the line and the turn only for a caller that waits
/// with turns on (a single try takes a free lock whoever's turn it is).
fn take_call(call: &AcquireCall<'_>) -> ScriptCall {
    let script = TAKE.call().key(call.name);
    let script = match call.waits && !call.turn_window.is_zero() {
        true => with_line(script, call.name),
        false => script,
    };
    script.arg(ms(call.lease)).arg(call.field)
}

/// `script` with the next two keys: the name's line and its turn (`raw::turns`).
fn with_line(script: ScriptCall, name: &str) -> ScriptCall {
    script
        .key_own(turns::CLIENTS, name)
        .key_own(turns::TURN, name)
}

/// The unlock of a plain lock, with its hand-over.
pub(super) fn release_call(conn: &Conn, call: &ReleaseCall<'_>) -> ScriptCall {
    if call.next.is_none() && !call.retry {
        return first_release_call(conn, call);
    }
    let script = UNLOCK
        .call()
        .key(call.name)
        .key(call.channel)
        .key(call.latch);
    with_line(script, call.name)
        .key_if(call.fenced, call.token_key)
        .arg(call.keep.map(ms).unwrap_or(0))
        .arg(call.field)
        .arg(ms(call.latch_ttl).max(1))
        .arg(call.holds)
        .arg(call.next.map(|n| n.0).unwrap_or(""))
        .arg(call.next.map(|n| ms(n.1)).unwrap_or(0))
        .arg(ms(call.turn_window))
        .arg(
            Flags::new()
                .set(b'r', call.retry)
                .set(b'F', call.fenced)
                .set(b'g', call.gives_way)
                .set(b'e', call.ends_run)
                .publish(conn),
        )
}

/// `lua/release.lua`: a first send with nobody to hand over to (a fenced lock's too:
/// only a hand-over draws a token). Its publish command is the script's own first line.
fn first_release_call(conn: &Conn, call: &ReleaseCall<'_>) -> ScriptCall {
    let script = match conn.publish_command() {
        "spublish" => &RELEASE_SHARDED,
        _ => &RELEASE,
    };
    let script = script
        .call()
        .key(call.name)
        .key(call.channel)
        .key(call.latch);
    let turns = !call.turn_window.is_zero();
    let script = match turns {
        true => with_line(script, call.name),
        false => script,
    };
    let script = (script.arg(call.field))
        .arg(call.holds)
        .arg(call.keep.map(ms).unwrap_or(0))
        .arg(ms(call.latch_ttl).max(1));
    // The window's sign says whether this client listens (`lua/release.lua`): one
    // argument, not two, as the server pays per argument.
    match (turns, call.listens) {
        (true, true) => script.arg(ms(call.turn_window)),
        (true, false) => script.arg(-i64::try_from(ms(call.turn_window)).unwrap_or(i64::MAX)),
        (false, _) => script,
    }
}
