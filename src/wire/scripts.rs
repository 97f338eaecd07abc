//! The Lua scripts of the protocol, compiled in from `lua/` and hashed once.
//!
//! Calls go out as `EVALSHA`; a server that does not know the script yet (fresh start,
//! `SCRIPT FLUSH`, failover to a replica that never saw it) answers `NOSCRIPT`, and the
//! call is sent once more as `EVAL`, which also caches the script for the next time.

use once_cell::sync::Lazy;
use redis::Value;

mod call;

pub(crate) use call::ScriptCall;

/// One script: its source and SHA1, computed once per process.
pub(crate) struct LuaScript {
    source: String,
    sha: String,
    /// Whether a reply says the script wrote (replica sync waits only then on a cluster).
    wrote: fn(&Value) -> bool,
}

impl LuaScript {
    fn new(source: String, wrote: fn(&Value) -> bool) -> Self {
        LuaScript {
            sha: redis::Script::new(&source).get_hash().to_string(),
            source,
            wrote,
        }
    }
}

/// The preludes scripts take in with a line `--#include <file>`, where they need them: the
/// server makes a script's functions anew on each run that reaches their definitions, so
/// a common path that returns before them pays nothing for them.
const INCLUDED: [(&str, &str); 4] = [
    ("lock_shape.lua", include_str!("../../lua/lock_shape.lua")),
    ("line.lua", include_str!("../../lua/line.lua")),
    ("published.lua", include_str!("../../lua/published.lua")),
    ("count_shape.lua", include_str!("../../lua/count_shape.lua")),
];

/// `text` with each of its `--#include <file>` lines replaced by that prelude's text. A
/// file not in [`INCLUDED`] leaves the line as it is (a test sees that none is left).
fn compose(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 4096);
    for line in text.split_inclusive('\n') {
        let file = line.trim_end().strip_prefix("--#include ");
        match INCLUDED.iter().find(|(name, _)| Some(*name) == file) {
            Some((_, prelude)) => out.push_str(prelude),
            None => out.push_str(line),
        }
    }
    out
}

/// The text of `lua/<file>`, its preludes included.
macro_rules! lua {
    ($file:literal) => {
        compose(include_str!(concat!("../../lua/", $file)))
    };
}

/// The acquire script (`lua/acquire.lua`).
pub(crate) static ACQUIRE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(lua!("acquire.lua"), |v| {
        *v == Value::Nil || matches!(v, Value::Array(a) if matches!(a.first(), Some(Value::Int(1))))
    })
});
/// The uncontended first send's acquire (`lua/take.lua`): it wrote a grant only when
/// it answers nil.
pub(crate) static TAKE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("take.lua"), |v| *v == Value::Nil));
/// The unlock script (`lua/unlock.lua`).
pub(crate) static UNLOCK: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("unlock.lua"), |v| *v != Value::Nil));
/// The first send's unlock with nobody to hand over to (`lua/release.lua`), publishing
/// with `PUBLISH`; [`RELEASE_SHARDED`] with `SPUBLISH`. The command is the script's
/// first line rather than an argument: the server pays per argument.
pub(crate) static RELEASE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        format!("local publish = 'publish'\n{}", lua!("release.lua")),
        |v| *v != Value::Nil,
    )
});
/// [`RELEASE`] publishing with `SPUBLISH`.
pub(crate) static RELEASE_SHARDED: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        format!("local publish = 'spublish'\n{}", lua!("release.lua")),
        |v| *v != Value::Nil,
    )
});
/// The batched renewal script (`lua/renew.lua`).
pub(crate) static RENEW: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        lua!("renew.lua"),
        |v| matches!(v, Value::Array(a) if a.contains(&Value::Int(1))),
    )
});
/// The force-unlock script (`lua/force_unlock.lua`).
pub(crate) static FORCE_UNLOCK: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("force_unlock.lua"), |v| *v == Value::Int(1)));
/// The fair lock's acquire (`lua/fair_acquire.lua`).
pub(crate) static FAIR_ACQUIRE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        lua!("fair_acquire.lua"),
        |v| matches!(v, Value::Array(a) if !a.is_empty()),
    )
});
/// The fair lock's unlock (`lua/fair_unlock.lua`).
pub(crate) static FAIR_UNLOCK: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("fair_unlock.lua"), |v| *v != Value::Nil));
/// A fair lock's waiter leaving its queue, or a force unlock (`lua/fair_leave.lua`).
pub(crate) static FAIR_LEAVE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("fair_leave.lua"), |_| true));

/// Takes semaphore permits (`lua/semaphore_acquire.lua`).
pub(crate) static SEMAPHORE_ACQUIRE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("semaphore_acquire.lua"), |v| *v == Value::Int(1)));
/// Gives or adds semaphore permits (`lua/semaphore_release.lua`).
pub(crate) static SEMAPHORE_RELEASE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("semaphore_release.lua"), |v| *v != Value::Nil));
/// Sets a semaphore's permits if absent (`lua/semaphore_set.lua`).
pub(crate) static SEMAPHORE_SET: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("semaphore_set.lua"), |v| *v == Value::Int(1)));
/// Drains a semaphore (`lua/semaphore_drain.lua`).
pub(crate) static SEMAPHORE_DRAIN: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("semaphore_drain.lua"), |v| *v != Value::Int(0)));
/// Takes expirable permits (`lua/permit_acquire.lua`).
pub(crate) static PERMIT_ACQUIRE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("permit_acquire.lua"), |_| true));
/// Gives expirable permits back (`lua/permit_release.lua`).
pub(crate) static PERMIT_RELEASE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("permit_release.lua"), |_| true));
/// Renews a permit's lease (`lua/permit_update.lua`).
pub(crate) static PERMIT_UPDATE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("permit_update.lua"), |_| true));
/// Renews the leases of a batch of permits (`lua/permit_renew.lua`).
pub(crate) static PERMIT_RENEW: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("permit_renew.lua"), |_| true));
/// Counts expirable permits (`lua/permit_available.lua`).
pub(crate) static PERMIT_AVAILABLE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("permit_available.lua"), |_| true));
/// Counts a latch down (`lua/latch_count_down.lua`).
pub(crate) static LATCH_COUNT_DOWN: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("latch_count_down.lua"), |_| true));
/// Sets a latch's count if absent (`lua/latch_set.lua`).
pub(crate) static LATCH_SET: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("latch_set.lua"), |v| *v == Value::Int(1)));
/// Deletes a semaphore or latch (`lua/count_delete.lua`).
pub(crate) static COUNT_DELETE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("count_delete.lua"), |v| *v == Value::Int(1)));
/// The read-write lock's read acquire (`lua/read_acquire.lua`).
pub(crate) static READ_ACQUIRE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        lua!("read_acquire.lua"),
        |v| matches!(v, Value::Array(a) if matches!(a.first(), Some(Value::Int(1)))),
    )
});
/// The read-write lock's write acquire (`lua/write_acquire.lua`).
pub(crate) static WRITE_ACQUIRE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        lua!("write_acquire.lua"),
        |v| matches!(v, Value::Array(a) if matches!(a.first(), Some(Value::Int(1)))),
    )
});
/// The read-write lock's read unlock (`lua/read_unlock.lua`).
pub(crate) static READ_UNLOCK: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("read_unlock.lua"), |v| *v != Value::Nil));
/// The read-write lock's write unlock (`lua/write_unlock.lua`).
pub(crate) static WRITE_UNLOCK: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("write_unlock.lua"), |v| *v != Value::Nil));
/// The batched renewal of read holds (`lua/read_renew.lua`).
pub(crate) static READ_RENEW: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        lua!("read_renew.lua"),
        |v| matches!(v, Value::Array(a) if a.contains(&Value::Int(1))),
    )
});
/// The read-write lock's force unlock (`lua/rw_force_unlock.lua`).
pub(crate) static RW_FORCE_UNLOCK: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(lua!("rw_force_unlock.lua"), |v| *v == Value::Int(1)));

/// The text the client sends for `lua/<file>`, preludes included (see [`compose`]), for
/// tools and tests that run the scripts as the client does.
pub(crate) fn source_of(file: &str) -> Option<&'static str> {
    let script: &'static LuaScript = match file {
        "acquire.lua" => &ACQUIRE,
        "take.lua" => &TAKE,
        "release.lua" => &RELEASE,
        "unlock.lua" => &UNLOCK,
        "renew.lua" => &RENEW,
        "force_unlock.lua" => &FORCE_UNLOCK,
        "fair_acquire.lua" => &FAIR_ACQUIRE,
        "fair_unlock.lua" => &FAIR_UNLOCK,
        "fair_leave.lua" => &FAIR_LEAVE,
        "semaphore_acquire.lua" => &SEMAPHORE_ACQUIRE,
        "semaphore_release.lua" => &SEMAPHORE_RELEASE,
        "semaphore_set.lua" => &SEMAPHORE_SET,
        "semaphore_drain.lua" => &SEMAPHORE_DRAIN,
        "permit_acquire.lua" => &PERMIT_ACQUIRE,
        "permit_release.lua" => &PERMIT_RELEASE,
        "permit_update.lua" => &PERMIT_UPDATE,
        "permit_renew.lua" => &PERMIT_RENEW,
        "permit_available.lua" => &PERMIT_AVAILABLE,
        "latch_count_down.lua" => &LATCH_COUNT_DOWN,
        "latch_set.lua" => &LATCH_SET,
        "count_delete.lua" => &COUNT_DELETE,
        "read_acquire.lua" => &READ_ACQUIRE,
        "write_acquire.lua" => &WRITE_ACQUIRE,
        "read_unlock.lua" => &READ_UNLOCK,
        "write_unlock.lua" => &WRITE_UNLOCK,
        "read_renew.lua" => &READ_RENEW,
        "rw_force_unlock.lua" => &RW_FORCE_UNLOCK,
        _ => return None,
    };
    Some(&script.source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_of_lua_is_sent_with_its_preludes_in_place() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        for entry in std::fs::read_dir(dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if INCLUDED.iter().any(|(prelude, _)| *prelude == name) {
                continue;
            }
            let text = source_of(&name).unwrap_or_else(|| panic!("{name} is not sent"));
            assert!(
                !text.contains("--#include"),
                "{name} keeps an include line compose() does not replace"
            );
        }
        assert!(source_of("take.lua")
            .unwrap()
            .contains("local function is_lock"));
    }

    #[test]
    fn hashes_are_sha1_hex() {
        for s in [
            &*ACQUIRE,
            &*UNLOCK,
            &*RENEW,
            &*FORCE_UNLOCK,
            &*SEMAPHORE_ACQUIRE,
            &*SEMAPHORE_RELEASE,
            &*SEMAPHORE_SET,
            &*SEMAPHORE_DRAIN,
            &*PERMIT_ACQUIRE,
            &*PERMIT_RELEASE,
            &*PERMIT_UPDATE,
            &*PERMIT_AVAILABLE,
            &*LATCH_COUNT_DOWN,
            &*LATCH_SET,
            &*READ_ACQUIRE,
            &*WRITE_ACQUIRE,
            &*READ_UNLOCK,
            &*WRITE_UNLOCK,
            &*READ_RENEW,
            &*RW_FORCE_UNLOCK,
            &*FAIR_ACQUIRE,
            &*FAIR_UNLOCK,
            &*FAIR_LEAVE,
        ] {
            assert_eq!(s.sha.len(), 40);
            assert!(s.sha.chars().all(|c| c.is_ascii_hexdigit()));
        }
        assert_ne!(ACQUIRE.sha, UNLOCK.sha);
    }
}
