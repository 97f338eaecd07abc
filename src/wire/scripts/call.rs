//! One call of a script: its keys and arguments packed once, sent by SHA with one
//! `EVAL` on `NOSCRIPT`.

use std::future::Future;

use redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, ToRedisArgs, Value};

use super::LuaScript;
use crate::wire::connection::{Conn, Synced};

impl LuaScript {
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
            false => ("EVAL", self.script.source.as_str()),
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
    use crate::wire::scripts::ACQUIRE;

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
}
