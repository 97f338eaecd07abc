//! Connection names (`docs/protocol.md` 1.6): every connection the client opens says
//! `CLIENT SETNAME <name>:<client uuid>`, so that `CLIENT LIST` maps the uuid of a holder
//! field to live connections. redis-rs 1.8 has no setting for a connection name and no
//! hook after a (re)connect (redis-rs issue 1727), so the name is sent here, right after
//! each connect, and again after a reconnect of a `ConnectionManager`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, PushInfo, PushKind, RedisError, RedisResult, Value};

/// `CLIENT SETNAME <name>`.
pub(crate) fn setname(name: &str) -> Cmd {
    redis::cmd("CLIENT").arg("SETNAME").arg(name).clone()
}

/// Names `conn` (on a cluster connection, every node connection it has: redis-rs sends
/// `CLIENT SETNAME` to all nodes). False when the connection failed, so that the name is
/// still to be sent; a refusal (an ACL user without `CLIENT`) counts as done, as the name
/// is for operators and the client works without it.
pub(crate) async fn set_name(conn: &mut impl ConnectionLike, name: &str) -> bool {
    match conn
        .req_packed_command(&setname(name))
        .await
        .and_then(|v| v.extract_error())
    {
        Ok(_) => true,
        Err(e) => {
            tracing::debug!(error = %e, name, "CLIENT SETNAME failed; the connection stays unnamed");
            !broken(&e)
        }
    }
}

/// `cmd` after `CLIENT SETNAME`, in one round trip on one connection. A refused name is
/// logged as in [`set_name`]; `cmd`'s own reply is returned.
pub(super) async fn named_query(
    conn: &mut impl ConnectionLike,
    name: &str,
    cmd: &Cmd,
) -> RedisResult<Value> {
    let mut pipe = redis::pipe();
    pipe.add_command(setname(name)).add_command(cmd.clone());
    let mut replies = conn.req_packed_commands(&pipe, 0, 2).await?.into_iter();
    if let Some(Value::ServerError(e)) = replies.next() {
        tracing::debug!(error = %RedisError::from(e), name, "CLIENT SETNAME failed; the connection stays unnamed");
    }
    replies.next().ok_or_else(|| {
        RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "a named query answered too few replies",
        ))
    })
}

/// Errors after which a `ConnectionManager` opens a new connection (a broken one, or a
/// failed connect): the ones its own reconnect checks for, and a little more, as naming
/// once too often costs one command.
fn broken(e: &RedisError) -> bool {
    e.is_unrecoverable_error() || e.is_io_error() || e.is_connection_dropped()
}

/// A `ConnectionManager` whose connection keeps its name across reconnects.
///
/// The manager reconnects on its own and says nothing about it. A reconnect follows an
/// error that breaks the connection, which this wrapper sees, as every command goes
/// through it; on RESP3 it may also follow a disconnect push, with no error, which the
/// push sender given at connect ([`watch_disconnects`]) reports. Either way the next
/// command goes out behind `CLIENT SETNAME`, in one round trip: naming costs no wait.
#[derive(Clone)]
pub(crate) struct NamedManager {
    manager: ConnectionManager,
    name: Arc<str>,
    /// The manager may be on a connection that is not named yet.
    unnamed: Arc<AtomicBool>,
}

impl NamedManager {
    /// Names the manager's first connection. `unnamed` is the flag given to
    /// [`watch_disconnects`], if any.
    pub(super) async fn new(
        mut manager: ConnectionManager,
        name: String,
        unnamed: Arc<AtomicBool>,
    ) -> NamedManager {
        if !set_name(&mut manager, &name).await {
            unnamed.store(true, Ordering::Release);
        }
        NamedManager {
            manager,
            name: name.into(),
            unnamed,
        }
    }

    /// Sends one command (see `ConnectionManager::send_packed_command`), behind
    /// `CLIENT SETNAME` when the connection may be a new one.
    pub(crate) async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        let mut manager = self.manager.clone();
        let reply = if self.unnamed.swap(false, Ordering::AcqRel) {
            // Set again unless the name went out: the next command names the connection
            // if this one failed, or was dropped before it was answered.
            let pending = Pending(Some(&self.unnamed));
            // Boxed: rare (after a reconnect), and inline it would double this future.
            let reply = Box::pin(named_query(&mut manager, &self.name, cmd)).await;
            if reply.is_ok() {
                pending.disarm();
            }
            reply
        } else {
            // Boxed, once, at the bottom: redis-rs's future is over a kilobyte, and
            // inline it made every future above it as large, each moved a few times
            // on every lock call (a tenth of the client's instructions per pair).
            // Boxed by redis-rs itself, which builds it in its box: boxed here, it was
            // built aside and copied in.
            manager.req_packed_command(cmd).await
        };
        if reply.as_ref().is_err_and(broken) {
            self.unnamed.store(true, Ordering::Release);
        }
        reply
    }
}

/// Sets the flag back when dropped armed (see [`NamedManager::send`]).
struct Pending<'a>(Option<&'a AtomicBool>);

impl Pending<'_> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(flag) = self.0 {
            flag.store(true, Ordering::Release);
        }
    }
}

/// A push sender for a RESP3 `ConnectionManager`: a disconnect push (after which the
/// manager reconnects at once, before any command fails) sets `unnamed`.
pub(super) fn watch_disconnects(
    unnamed: Arc<AtomicBool>,
) -> impl Fn(PushInfo) -> Result<(), std::convert::Infallible> + Send + Sync + 'static {
    move |push| {
        if push.kind == PushKind::Disconnection {
            unnamed.store(true, Ordering::Release);
        }
        Ok(())
    }
}
