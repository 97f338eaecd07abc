//! The subscriber connection of one server, and this client's mark on a lock's channel.
//!
//! A release that gives a turn yields to a subscriber of the lock's channel that is not a
//! client of this crate (a Redisson waiter, which the line cannot hold). To tell the two
//! apart, a client of this crate that listens on a plain lock's channel with turns on
//! also holds an `SSUBSCRIBE` of the same channel: the sharded namespace, which nobody
//! publishes its messages in on a single server, and which `PUBSUB NUMSUB` does not count.
//! A plain subscriber beyond the marks is someone else's (`docs/protocol.md` 2.6).
//!
//! Only a RESP3 connection can carry both subscriptions and their messages (redis-rs'
//! RESP2 `aio::PubSub` sends no `SSUBSCRIBE`), so the listener speaks RESP3 where the
//! server does, and RESP2 without marks where it does not (a server older than Redis 6).
//! A server that refuses the mark (Redis 6, an ACL) is listened to without it.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::wire::connection::set_name;

/// A channel to listen on, and whether to mark it as this client's.
pub(super) type Wanted = (Arc<str>, bool);

/// One subscriber connection.
pub(super) enum Listener {
    /// Messages come as pushes. `marks` stays true until the server refuses one.
    Resp3 {
        conn: redis::aio::MultiplexedConnection,
        pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
        marks: bool,
    },
    /// A server without RESP3: plain subscriptions only.
    Resp2 {
        sink: redis::aio::PubSubSink,
        stream: redis::aio::PubSubStream,
    },
}

impl Listener {
    /// Opens a listener on `client`'s server within `connect`, named `name` where it
    /// speaks RESP3 (`docs/protocol.md` 1.6). A server that answers RESP3's greeting
    /// with an error is listened to over RESP2 on this connection only: the next one
    /// asks again, since the refusal may not last (a disabled user, a full server, an
    /// older server upgraded behind the same address or failed over to a newer one).
    pub(super) async fn open(
        client: &redis::Client,
        name: &str,
        (connect, response): (Duration, Duration),
    ) -> Result<Listener, String> {
        match open_resp3(client, name, connect, response).await {
            Ok(listener) => return Ok(listener),
            Err(e) if server_refused(&e) => {
                tracing::debug!(error = %e, "no RESP3 for pub/sub; listening without marks");
            }
            Err(e) => return Err(e.to_string()),
        }
        let pubsub = tokio::time::timeout(connect, client.get_async_pubsub())
            .await
            .map_err(|_| "pub/sub connect timed out".to_string())?
            .map_err(|e| e.to_string())?;
        let (sink, stream) = pubsub.split();
        Ok(Listener::Resp2 { sink, stream })
    }

    /// Subscribes `channels`, each marked one with its mark first: a count taken between
    /// the two then sees no plain subscriber of this client without its mark. One round
    /// trip: a multiplexed connection sends the commands in order.
    pub(super) async fn subscribe(
        &mut self,
        channels: &[Wanted],
        limit: Duration,
    ) -> Result<(), String> {
        if channels.is_empty() {
            return Ok(());
        }
        match self {
            Listener::Resp2 { sink, .. } => {
                let names: Vec<&str> = channels.iter().map(|(c, _)| &**c).collect();
                timed(limit, sink.subscribe(names)).await
            }
            Listener::Resp3 { conn, marks, .. } => {
                let mut sends = Vec::with_capacity(2 * channels.len());
                for (ch, mark) in channels {
                    if *mark && *marks {
                        sends.push(("SSUBSCRIBE", ch.clone()));
                    }
                    sends.push(("SUBSCRIBE", ch.clone()));
                }
                let replies = timed_all(limit, conn, sends).await?;
                for (name, reply) in replies {
                    match reply {
                        Ok(()) => {}
                        Err(e) if name == "SSUBSCRIBE" && server_refused(&e) => {
                            tracing::debug!(error = %e, "the server refuses marks; listening without them");
                            *marks = false;
                        }
                        Err(e) => return Err(e.to_string()),
                    }
                }
                Ok(())
            }
        }
    }

    /// Unsubscribes `channels`, the plain subscription before the mark (see
    /// [`Listener::subscribe`]).
    pub(super) async fn unsubscribe(
        &mut self,
        channels: &[Wanted],
        limit: Duration,
    ) -> Result<(), String> {
        if channels.is_empty() {
            return Ok(());
        }
        match self {
            Listener::Resp2 { sink, .. } => {
                let names: Vec<&str> = channels.iter().map(|(c, _)| &**c).collect();
                timed(limit, sink.unsubscribe(names)).await
            }
            Listener::Resp3 { conn, .. } => {
                let plain = channels.iter().map(|(ch, _)| ("UNSUBSCRIBE", ch.clone()));
                let marked = channels.iter().filter(|(_, m)| *m);
                let marks = marked.map(|(ch, _)| ("SUNSUBSCRIBE", ch.clone()));
                let sends = plain.chain(marks).collect();
                for (_, reply) in timed_all(limit, conn, sends).await? {
                    reply.map_err(|e| e.to_string())?;
                }
                Ok(())
            }
        }
    }

    /// Whether a mark goes with a channel that asks for one.
    pub(super) fn marks(&self) -> bool {
        matches!(self, Listener::Resp3 { marks: true, .. })
    }

    /// The next message, or `None` once the connection is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: a message is taken from the connection only when returned.
    pub(super) async fn next(&mut self) -> Option<redis::Msg> {
        match self {
            Listener::Resp2 { stream, .. } => stream.next().await,
            Listener::Resp3 { pushes, .. } => loop {
                let push = pushes.recv().await?;
                if push.kind == redis::PushKind::Disconnection {
                    return None;
                }
                if let Some(msg) = redis::Msg::from_push_info(push) {
                    return Some(msg);
                }
            },
        }
    }
}

async fn open_resp3(
    client: &redis::Client,
    name: &str,
    connect: Duration,
    response: Duration,
) -> redis::RedisResult<Listener> {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let client = redis::Client::open(info.set_redis_settings(settings))?;
    let (tx, pushes) = mpsc::unbounded_channel();
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect))
        .set_response_timeout(Some(response))
        .set_push_sender(tx);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    // A name refused (an ACL user without `CLIENT`) leaves the connection unnamed; a
    // broken connection shows at the first subscription.
    set_name(&mut conn, name).await;
    Ok(Listener::Resp3 {
        conn,
        pushes,
        marks: true,
    })
}

/// An error the server answered, as opposed to a broken or slow connection.
fn server_refused(e: &redis::RedisError) -> bool {
    !(e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal())
}

/// Sends each `(command, channel)` in order and waits for every reply, within `limit`.
async fn timed_all(
    limit: Duration,
    conn: &redis::aio::MultiplexedConnection,
    sends: Vec<(&'static str, Arc<str>)>,
) -> Result<Vec<(&'static str, redis::RedisResult<()>)>, String> {
    let replies = sends.into_iter().map(|(name, ch)| {
        let mut conn = conn.clone();
        let mut cmd = redis::cmd(name);
        cmd.arg(&*ch);
        async move {
            (
                name,
                cmd.query_async::<redis::Value>(&mut conn).await.map(drop),
            )
        }
    });
    tokio::time::timeout(limit, join_all(replies))
        .await
        .map_err(|_| format!("no answer within {limit:?}"))
}

async fn timed<F>(limit: Duration, fut: F) -> Result<(), String>
where
    F: std::future::Future<Output = redis::RedisResult<()>>,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}
