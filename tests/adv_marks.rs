//! Adversarial review of the listeners' marks (`docs/protocol.md` 1.4, 1.6, 2.6): a
//! listening client of this crate holds an `SSUBSCRIBE` of a plain lock's channel, and a
//! release yields its turn only to a plain subscriber beyond the marks. These tests kill
//! the marked connection, refuse it for a moment, listen as ACL users that may not mark,
//! count, or name, and put a stray mark next to a Redisson waiter.

mod common;

use std::time::{Duration, Instant};

use common::turns::take_and_release;
use common::RedisServer;
use redis_rlock::protocol::channel_name;
use redis_rlock::Client;

/// A holder of another client (Redisson's field layout) for `ms`.
fn held_elsewhere(conn: &mut redis::Connection, name: &str, ms: u64) {
    let field = "d1b0f1a4-7c2e-4b8a-9f3d-5e6a7b8c9d0e:1";
    let _: i64 = redis::cmd("HSET")
        .arg(name)
        .arg(field)
        .arg(1)
        .query(conn)
        .unwrap();
    let _: i64 = redis::cmd("PEXPIRE").arg(name).arg(ms).query(conn).unwrap();
}

/// That holder's release as Redisson's unlock sends it.
fn released_elsewhere(conn: &mut redis::Connection, name: &str) {
    let _: i64 = redis::cmd("DEL").arg(name).query(conn).unwrap();
    let _: i64 = redis::cmd("PUBLISH")
        .arg(channel_name(name))
        .arg("0")
        .query(conn)
        .unwrap();
}

fn count(conn: &mut redis::Connection, sub: &str, channel: &str) -> i64 {
    let v: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg(sub)
        .arg(channel)
        .query(conn)
        .unwrap();
    redis::from_redis_value(v[1].clone()).unwrap()
}

/// (plain subscribers, marks) of `name`'s channel.
fn counts(conn: &mut redis::Connection, name: &str) -> (i64, i64) {
    let ch = channel_name(name);
    (count(conn, "NUMSUB", &ch), count(conn, "SHARDNUMSUB", &ch))
}

/// A `client` waiter on `name`, held elsewhere, counted once it subscribed and then
/// released elsewhere: (plain subscribers, marks) while it waited, and how long after
/// the release it got the lock (panics past 5 s).
async fn wait_and_count(s: &RedisServer, client: &Client, name: &str) -> ((i64, i64), Duration) {
    let mut admin = s.conn();
    held_elsewhere(&mut admin, name, 30_000);
    let waiter = take_and_release(client.lock(name));
    let ch = channel_name(name);
    let subscribed = common::eventually(Duration::from_secs(5), || s.numsub(&ch) == 1).await;
    assert!(subscribed, "{name}: the waiter never subscribed");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let seen = counts(&mut admin, name);
    let released = Instant::now();
    released_elsewhere(&mut admin, name);
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap_or_else(|_| panic!("{name}: the waiter was not served within 5 s"))
        .unwrap();
    (seen, got.saturating_duration_since(released))
}

/// `s`'s address as ACL user `user` (password `pw`).
fn url_as(s: &RedisServer, user: &str) -> String {
    s.url()
        .replacen("redis://", &format!("redis://{user}:pw@"), 1)
}

fn acl(conn: &mut redis::Connection, args: &[&str]) {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(args)
        .query(conn)
        .unwrap();
}

/// A server that answers RESP3's greeting with an error for a while (here the client's
/// ACL user disabled and enabled again, as an operator may while rotating passwords)
/// must not cost the client its marks for the rest of its life: once the greeting is
/// accepted again, a waiter's subscription carries its mark. Before the fix the listener
/// latched RESP2 on that refusal and never marked again (`(1, 0)`: one plain
/// subscriber, no mark), so each turn it was given with another of its kind listening
/// yielded 2 ms to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greeting_refused_for_a_while_does_not_end_the_marks() {
    let s = RedisServer::start();
    let mut admin = s.conn();
    acl(&mut admin, &["app", "on", ">pw", "~*", "&*", "+@all"]);
    let client = Client::connect(url_as(&s, "app")).await.unwrap();
    let ((plain, marks), _) = wait_and_count(&s, &client, "am:user:before").await;
    assert_eq!((plain, marks), (1, 1), "marked before");
    // The user is refused while its listener reconnects for a waiter.
    acl(&mut admin, &["app", "off"]);
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut admin)
        .unwrap();
    let name = "am:user:off";
    held_elsewhere(&mut admin, name, 30_000);
    let waiter = take_and_release(client.lock(name));
    tokio::time::sleep(Duration::from_millis(300)).await;
    acl(&mut admin, &["app", "on"]);
    let ch = channel_name(name);
    let subscribed = common::eventually(Duration::from_secs(5), || s.numsub(&ch) == 1).await;
    assert!(subscribed, "the waiter never subscribed");
    released_elsewhere(&mut admin, name);
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was served")
        .unwrap();
    let ((plain, marks), after) = wait_and_count(&s, &client, "am:user:after").await;
    assert!(after < Duration::from_secs(1), "{after:?}");
    assert_eq!(
        (plain, marks),
        (1, 1),
        "a refusal of a while ended the marks for good"
    );
    client.shutdown().await.unwrap();
}
