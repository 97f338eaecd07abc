//! The Lua scripts of the protocol, compiled in from `lua/` and hashed once.
//!
//! Calls go out as `EVALSHA`; a server that does not know the script yet (fresh start,
//! `SCRIPT FLUSH`, failover to a replica that never saw it) answers `NOSCRIPT`, and the
//! call is sent once more as `EVAL`, which also caches the script for the next time.

use std::future::Future;

use once_cell::sync::Lazy;
use redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, ToRedisArgs, Value};

use crate::wire::connection::{Conn, Synced};

/// One script: its source and SHA1, computed once per process.
pub(crate) struct LuaScript {
    source: &'static str,
    sha: String,
    /// Whether a reply says the script wrote (replica sync waits only then on a cluster).
    wrote: fn(&Value) -> bool,
}

impl LuaScript {
    fn new(source: &'static str, wrote: fn(&Value) -> bool) -> Self {
        LuaScript {
            source,
            sha: redis::Script::new(source).get_hash().to_string(),
            wrote,
        }
    }

    /// A call of this script with `keys` and `args`, ready to send.
    pub(crate) fn call(&'static self) -> ScriptCall {
        ScriptCall {
            script: self,
            // The unlock's keys and arguments with a name of 20 bytes take about 400.
            data: Vec::with_capacity(512),
            ends: Vec::with_capacity(20),
            keys: 0,
        }
    }
}

/// A script that takes or deletes a lock, behind `lua/lock_shape.lua`, which tells a lock
/// from a hash of application data.
macro_rules! shaped {
    ($file:literal) => {
        concat!(
            include_str!("../../lua/lock_shape.lua"),
            include_str!(concat!("../../lua/", $file))
        )
    };
}

/// The text of a script made of several files of `lua/`, preludes first.
macro_rules! lua {
    ($($file:literal),+) => {
        concat!($(include_str!(concat!("../../lua/", $file))),+)
    };
}

/// The acquire script (`lua/acquire.lua`).
pub(crate) static ACQUIRE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(lua!("lock_shape.lua", "line.lua", "acquire.lua"), |v| {
        *v == Value::Nil || matches!(v, Value::Array(a) if matches!(a.first(), Some(Value::Int(1))))
    })
});
/// The uncontended first send's acquire (`lua/take.lua`): it wrote a grant only when
/// it answers nil.
pub(crate) static TAKE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(lua!("lock_shape.lua", "line.lua", "take.lua"), |v| {
        *v == Value::Nil
    })
});
/// The unlock script (`lua/unlock.lua`).
pub(crate) static UNLOCK: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(lua!("line.lua", "published.lua", "unlock.lua"), |v| {
        *v != Value::Nil
    })
});
/// The first send's unlock with nobody to hand over to (`lua/release.lua`), publishing
/// with `PUBLISH`; [`RELEASE_SHARDED`] with `SPUBLISH`. The command is the script's
/// first line rather than an argument: the server pays per argument.
pub(crate) static RELEASE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        concat!(
            "local publish = 'publish'\n",
            lua!("published.lua", "release.lua")
        ),
        |v| *v != Value::Nil,
    )
});
/// [`RELEASE`] publishing with `SPUBLISH`.
pub(crate) static RELEASE_SHARDED: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        concat!(
            "local publish = 'spublish'\n",
            lua!("published.lua", "release.lua")
        ),
        |v| *v != Value::Nil,
    )
});
/// The batched renewal script (`lua/renew.lua`).
pub(crate) static RENEW: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        include_str!("../../lua/renew.lua"),
        |v| matches!(v, Value::Array(a) if a.contains(&Value::Int(1))),
    )
});
/// The force-unlock script (`lua/force_unlock.lua`).
pub(crate) static FORCE_UNLOCK: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(shaped!("force_unlock.lua"), |v| *v == Value::Int(1)));
/// The fair lock's acquire (`lua/fair_acquire.lua`).
pub(crate) static FAIR_ACQUIRE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        shaped!("fair_acquire.lua"),
        |v| matches!(v, Value::Array(a) if !a.is_empty()),
    )
});
/// The fair lock's unlock (`lua/fair_unlock.lua`).
pub(crate) static FAIR_UNLOCK: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(include_str!("../../lua/fair_unlock.lua"), |v| {
        *v != Value::Nil
    })
});
/// A fair lock's waiter leaving its queue, or a force unlock (`lua/fair_leave.lua`).
pub(crate) static FAIR_LEAVE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(shaped!("fair_leave.lua"), |_| true));

/// A script that writes a semaphore's or latch's count, behind `lua/count_shape.lua`,
/// which answers WRONGTYPE for a key that holds no count.
macro_rules! counted {
    ($file:literal) => {
        concat!(
            include_str!("../../lua/count_shape.lua"),
            include_str!(concat!("../../lua/", $file))
        )
    };
}

/// Takes semaphore permits (`lua/semaphore_acquire.lua`).
pub(crate) static SEMAPHORE_ACQUIRE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(include_str!("../../lua/semaphore_acquire.lua"), |v| {
        *v == Value::Int(1)
    })
});
/// Gives or adds semaphore permits (`lua/semaphore_release.lua`).
pub(crate) static SEMAPHORE_RELEASE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(include_str!("../../lua/semaphore_release.lua"), |v| {
        *v != Value::Nil
    })
});
/// Sets a semaphore's permits if absent (`lua/semaphore_set.lua`).
pub(crate) static SEMAPHORE_SET: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(counted!("semaphore_set.lua"), |v| *v == Value::Int(1)));
/// Drains a semaphore (`lua/semaphore_drain.lua`).
pub(crate) static SEMAPHORE_DRAIN: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(include_str!("../../lua/semaphore_drain.lua"), |v| {
        *v != Value::Int(0)
    })
});
/// Takes expirable permits (`lua/permit_acquire.lua`).
pub(crate) static PERMIT_ACQUIRE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(counted!("permit_acquire.lua"), |_| true));
/// Gives expirable permits back (`lua/permit_release.lua`).
pub(crate) static PERMIT_RELEASE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(counted!("permit_release.lua"), |_| true));
/// Renews a permit's lease (`lua/permit_update.lua`).
pub(crate) static PERMIT_UPDATE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(counted!("permit_update.lua"), |_| true));
/// Renews the leases of a batch of permits (`lua/permit_renew.lua`).
pub(crate) static PERMIT_RENEW: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(counted!("permit_renew.lua"), |_| true));
/// Counts expirable permits (`lua/permit_available.lua`).
pub(crate) static PERMIT_AVAILABLE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(counted!("permit_available.lua"), |_| true));
/// Counts a latch down (`lua/latch_count_down.lua`).
pub(crate) static LATCH_COUNT_DOWN: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(counted!("latch_count_down.lua"), |_| true));
/// Sets a latch's count if absent (`lua/latch_set.lua`).
pub(crate) static LATCH_SET: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(counted!("latch_set.lua"), |v| *v == Value::Int(1)));
/// Deletes a semaphore or latch (`lua/count_delete.lua`).
pub(crate) static COUNT_DELETE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(counted!("count_delete.lua"), |v| *v == Value::Int(1)));
/// The read-write lock's read acquire (`lua/read_acquire.lua`).
pub(crate) static READ_ACQUIRE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        shaped!("read_acquire.lua"),
        |v| matches!(v, Value::Array(a) if matches!(a.first(), Some(Value::Int(1)))),
    )
});
/// The read-write lock's write acquire (`lua/write_acquire.lua`).
pub(crate) static WRITE_ACQUIRE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        shaped!("write_acquire.lua"),
        |v| matches!(v, Value::Array(a) if matches!(a.first(), Some(Value::Int(1)))),
    )
});
/// The read-write lock's read unlock (`lua/read_unlock.lua`).
pub(crate) static READ_UNLOCK: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(include_str!("../../lua/read_unlock.lua"), |v| {
        *v != Value::Nil
    })
});
/// The read-write lock's write unlock (`lua/write_unlock.lua`).
pub(crate) static WRITE_UNLOCK: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(include_str!("../../lua/write_unlock.lua"), |v| {
        *v != Value::Nil
    })
});
/// The batched renewal of read holds (`lua/read_renew.lua`).
pub(crate) static READ_RENEW: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        include_str!("../../lua/read_renew.lua"),
        |v| matches!(v, Value::Array(a) if a.contains(&Value::Int(1))),
    )
});
/// The read-write lock's force unlock (`lua/rw_force_unlock.lua`).
pub(crate) static RW_FORCE_UNLOCK: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(shaped!("rw_force_unlock.lua"), |v| *v == Value::Int(1)));

/// The text the client sends for `lua/<file>`, prelude included (see [`shaped`]), for
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
    Some(script.source)
}

type Reply = RedisResult<(Value, Synced)>;

/// Keys and arguments for one script call. Owns its data so the call can outlive the
/// caller's future (a request finished in the background after its caller left).
///
/// Keys and arguments are packed into one buffer (two allocations per call, not one per
/// item): a lock call has up to 18 of them, and building them was a tenth of the
/// client's instructions per lock and unlock pair.
pub(crate) struct ScriptCall {
    script: &'static LuaScript,
    /// The keys, then the arguments, back to back.
    data: Vec<u8>,
    /// Where each item ends in `data`.
    ends: Vec<usize>,
    keys: usize,
}

/// Lets `ToRedisArgs` values write themselves into a [`ScriptCall`]'s buffer.
struct Items<'a> {
    data: &'a mut Vec<u8>,
    ends: &'a mut Vec<usize>,
}

impl redis::RedisWrite for Items<'_> {
    fn write_arg(&mut self, arg: &[u8]) {
        self.data.extend_from_slice(arg);
        self.ends.push(self.data.len());
    }

    fn write_arg_fmt(&mut self, arg: impl std::fmt::Display) {
        use std::io::Write;
        let _ = write!(self.data, "{arg}");
        self.ends.push(self.data.len());
    }

    fn writer_for_next_arg(&mut self) -> impl std::io::Write + '_ {
        NextItem(self)
    }
}

/// One item written piecemeal; it ends where the writer is dropped.
struct NextItem<'a, 'b>(&'a mut Items<'b>);

impl std::io::Write for NextItem<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.data.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for NextItem<'_, '_> {
    fn drop(&mut self) {
        self.0.ends.push(self.0.data.len());
    }
}

impl ScriptCall {
    pub(crate) fn key(mut self, key: impl AsRef<[u8]>) -> Self {
        debug_assert_eq!(self.keys, self.ends.len(), "keys go before arguments");
        self.data.extend_from_slice(key.as_ref());
        self.ends.push(self.data.len());
        self.keys += 1;
        self
    }

    /// `key`, if `present`: a script's optional last key (a fenced lock's counter, which
    /// a plain lock never names).
    pub(crate) fn key_if(self, present: bool, key: impl AsRef<[u8]>) -> Self {
        if present {
            self.key(key)
        } else {
            self
        }
    }

    /// The key `<prefix>:{<name>}`, or `<prefix>:<name>:t` when `name` has a hash tag:
    /// one key per name even where `a` and `{a}` share Redisson's (the line and the
    /// turn, `raw::turns`), written without a `String` of its own.
    pub(crate) fn key_own(mut self, prefix: &str, name: &str) -> Self {
        debug_assert_eq!(self.keys, self.ends.len(), "keys go before arguments");
        let tagged = crate::wire::slot::has_hash_tag(name.as_bytes());
        // Fixed-length joints: a slice of either length was a call to `memcpy` each.
        self.data.extend_from_slice(prefix.as_bytes());
        match tagged {
            true => self.data.push(b':'),
            false => self.data.extend_from_slice(b":{"),
        }
        self.data.extend_from_slice(name.as_bytes());
        match tagged {
            true => self.data.extend_from_slice(b":t"),
            false => self.data.push(b'}'),
        }
        self.ends.push(self.data.len());
        self.keys += 1;
        self
    }

    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        arg.write_redis_args(&mut Items {
            data: &mut self.data,
            ends: &mut self.ends,
        });
        self
    }

    /// The keys written so far, as text (unit tests of the key layout).
    #[cfg(test)]
    pub(crate) fn keys_as_text(&self) -> Vec<String> {
        let keys = self.items().take(self.keys);
        keys.map(|k| String::from_utf8_lossy(k).into_owned())
            .collect()
    }

    fn items(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(self.ends.iter()).map(|(a, &b)| &self.data[a..b])
    }

    fn command(&self, by_sha: bool) -> Cmd {
        let (verb, body) = match by_sha {
            true => ("EVALSHA", self.script.sha.as_str()),
            false => ("EVAL", self.script.source),
        };
        // Sized once: growing it item by item reallocated about as often as it wrote.
        let mut cmd = Cmd::with_capacity(self.ends.len() + 3, self.data.len() + body.len() + 16);
        cmd.arg(verb).arg(body).arg(self.keys);
        for item in self.items() {
            cmd.arg(item);
        }
        cmd
    }

    /// The first key: where a cluster routes the call.
    fn first_key(&self) -> &[u8] {
        match self.keys {
            0 => &[],
            _ => &self.data[..self.ends[0]],
        }
    }

    /// Sends the call by SHA, falling back to the full source on `NOSCRIPT`; followed
    /// by the replica sync `WAIT` on the same connection when sync is on.
    pub(crate) fn run(self, conn: &Conn) -> impl Future<Output = Reply> + '_ {
        self.send(conn, true)
    }

    /// As [`run`](Self::run), never followed by `WAIT`: for writes whose caller would do
    /// nothing with the replicas' answer (`WAIT` only delays the reply).
    pub(crate) fn run_unsynced(self, conn: &Conn) -> impl Future<Output = Reply> + '_ {
        self.send(conn, false)
    }

    // Not an `async fn`, which keeps its arguments twice (as given and as locals): a
    // lock call's request future is boxed whole, and past 1,032 bytes `malloc` leaves
    // its fast path. Hence too the scoped command and the boxed (rare) fallback.
    #[allow(clippy::manual_async_fn)]
    fn send(self, conn: &Conn, synced: bool) -> impl Future<Output = Reply> + '_ {
        async move {
            let sent = {
                let cmd = self.command(true);
                self.query(conn, &cmd, synced).await
            };
            match sent {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    let cmd = self.command(false);
                    Box::pin(self.query(conn, &cmd, synced)).await
                }
                other => other,
            }
        }
    }

    async fn query(&self, conn: &Conn, cmd: &Cmd, synced: bool) -> Reply {
        match synced {
            true => (conn.query_synced(cmd, self.first_key(), self.script.wrote)).await,
            false => Ok((conn.query(cmd).await?, Synced::NotAsked)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_packs_its_keys_and_arguments_in_order() {
        let call = ACQUIRE
            .call()
            .key("a")
            .key_own("p", "n")
            .key_own("p", "x{t}y")
            .arg(7u64)
            .arg("")
            .arg(&["u", "v"][..]);
        let items: Vec<&[u8]> = call.items().collect();
        let want: [&[u8]; 6] = [b"a", b"p:{n}", b"p:x{t}y:t", b"7", b"", b"u"];
        assert_eq!(&items[..6], &want[..]);
        assert_eq!(items[6], b"v");
        assert_eq!(call.keys, 3);
        assert_eq!(call.first_key(), b"a");
        let packed = call.command(true).get_packed_command();
        let text = String::from_utf8(packed).unwrap();
        assert!(text.starts_with("*10\r\n$7\r\nEVALSHA\r\n"), "{text}");
        assert!(text.contains("\r\n$1\r\n3\r\n$1\r\na\r\n"), "{text}");
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
