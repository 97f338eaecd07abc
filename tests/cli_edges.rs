//! The edges an adversarial review of the ops tool and the lock-shape rule found: data
//! that looks almost like a lock, ACLs, binary fields, and `watch` on fair and
//! read-write locks and on a busy lock. Each failed before its fix.
#![cfg(feature = "cli")]

mod cli_common;
mod common;

use std::collections::BTreeMap;
use std::process::Output;
use std::time::Duration;

use cli_common::{rlock, rlock_async};
use common::RedisServer;
use redis_rlock::{Client, Error, OwnerId};

fn events(out: &Output) -> Vec<(String, String)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, '\t');
            let (_, event, detail) = (parts.next()?, parts.next()?, parts.next()?);
            Some((event.to_string(), detail.to_string()))
        })
        .filter(|(e, _)| e != "subscribers" && e != "renewed" && e != "holds" && e != "state")
        .collect()
}

fn fields(s: &RedisServer, key: &str) -> BTreeMap<String, String> {
    s.cmd(&["HGETALL", key])
}

/// A reader that leaves while others read publishes nothing (only the last one out
/// does, as in Redisson): `watch` tells a release, not a `DEL` by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_tells_a_reader_leaving_other_readers_as_a_release() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let rw = c.read_write_lock("rw:1");
    // Someone holds it already, so that watch starts on a lock.
    let first = OwnerId::unique().run(rw.read().lock()).await.unwrap();
    let watching = tokio::spawn(rlock_async(s.url(), &["watch", "rw:1", "--for", "3"]));
    tokio::time::sleep(Duration::from_millis(700)).await;
    let second = OwnerId::unique().run(rw.read().lock()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let first_field = first.holder_field().to_string();
    first.unlock().await.unwrap(); // `second` still reads
    tokio::time::sleep(Duration::from_millis(400)).await;
    drop(second);
    let out = watching.await.unwrap();
    let seen = events(&out);
    let about_first: Vec<_> = seen
        .iter()
        .filter(|(_, d)| d.starts_with(&first_field))
        .collect();
    assert!(
        about_first.iter().any(|(e, _)| e == "released"),
        "an unlock read as something else: {seen:#?}"
    );
}

/// A fair unlock tells only the next waiter, on its own channel; with nobody waiting it
/// publishes nothing, and `watch` still tells a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_tells_a_fair_unlock_with_nobody_waiting_as_a_release() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let lock = c.fair_lock("f:1");
    let g = lock.lock().await.unwrap();
    let field = g.holder_field().to_string();
    let watching = tokio::spawn(rlock_async(s.url(), &["watch", "f:1", "--for", "2"]));
    tokio::time::sleep(Duration::from_millis(700)).await;
    g.unlock().await.unwrap();
    let out = watching.await.unwrap();
    let seen = events(&out);
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(seen[0].0, "released", "{seen:#?}");
    assert!(seen[0].1.starts_with(&field), "{seen:#?}");
}

/// Readers share the lock: one leaving as another comes within one reading is no
/// hand-over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_never_pairs_readers_as_a_handover() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let rw = c.read_write_lock("rw:2");
    let keep = OwnerId::unique().run(rw.read().lock()).await.unwrap();
    let r1 = OwnerId::unique().run(rw.read().lock()).await.unwrap();
    let watching = tokio::spawn(rlock_async(s.url(), &["watch", "rw:2", "--for", "2"]));
    tokio::time::sleep(Duration::from_millis(700)).await;
    r1.unlock().await.unwrap();
    let r2 = OwnerId::unique().run(rw.read().lock()).await.unwrap();
    let out = watching.await.unwrap();
    drop((keep, r2));
    let seen = events(&out);
    assert!(
        !seen.iter().any(|(e, _)| e == "handover"),
        "shared readers told as a hand-over: {seen:#?}"
    );
}

/// On a busy lock, releases come faster than `watch` waits for late messages: it still
/// reports, and stops at `--for`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_keeps_its_time_on_a_busy_lock() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let _: () = s.cmd(&[
        "HSET",
        "hot:1",
        "0f0e0d0c-0b0a-4908-8706-050403020100:1",
        "1",
    ]);
    let _: () = s.cmd(&["PEXPIRE", "hot:1", "100000"]);
    let url = s.url();
    let watching = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let out = rlock_async(url, &["watch", "hot:1", "--for", "2"]).await;
        (out, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let _: () = s.cmd(&["DEL", "hot:1"]);
    // Four tasks taking turns on the lock, 5 ms holds: about 100 releases a second.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (lock, stop) = (c.lock("hot:1"), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let g = lock.lock().await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                g.unlock().await.unwrap();
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let (out, took) = watching.await.unwrap();
    let seen = events(&out);
    assert!(
        seen.iter().any(|(e, _)| e == "handover" || e == "acquired"),
        "{seen:#?}"
    );
    assert!(
        took < Duration::from_secs(4),
        "watch --for 2 ran {took:?}, {} events",
        seen.len()
    );
}

/// An ACL without HKEYS (HGETALL allowed): a read acquire on application data with a
/// `mode` field writes nothing into it.
#[tokio::test]
async fn a_read_acquire_under_an_acl_without_hkeys_leaves_data_alone() {
    let s = RedisServer::start();
    let _: () = s.cmd(&[
        "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-hkeys",
    ]);
    let _: () = s.cmd(&["HSET", "doc:1", "mode", "read", "title", "draft"]);
    let before = fields(&s, "doc:1");
    let url = format!("redis://app:pw@127.0.0.1:{}", s.port);
    let c = Client::connect(url).await.unwrap();
    let r = c.read_write_lock("doc:1").read().try_lock().await;
    let after = fields(&s, "doc:1");
    let ttl: i64 = s.cmd(&["PTTL", "doc:1"]);
    assert!(
        after == before && ttl == -1,
        "read try_lock answered {:?}; hash now {after:?}, pttl {ttl}",
        r.as_ref().map(|g| g.is_some())
    );
}

/// `is_locked` on either half of a read-write lock applies the lock-shape rule, as the
/// plain lock does.
#[tokio::test]
async fn is_locked_of_a_read_write_half_refuses_data() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let _: () = s.cmd(&["HSET", "doc:2", "mode", "write", "title", "draft"]);
    let plain = c.lock("doc:2").is_locked().await;
    assert!(matches!(plain, Err(Error::NotALock { .. })), "{plain:?}");
    let rw = c.read_write_lock("doc:2").write().is_locked().await;
    assert!(
        matches!(rw, Err(Error::NotALock { .. })),
        "write().is_locked() = {rw:?}"
    );
}

/// A field that is not UTF-8 is data: `is_locked` answers NotALock, `inspect` exit 4.
#[tokio::test]
async fn a_binary_field_is_data() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let mut conn = s.conn();
    let _: () = redis::cmd("HSET")
        .arg("bin:1")
        .arg(&b"\xff\xfe"[..])
        .arg("1")
        .query(&mut conn)
        .unwrap();
    let r = c.lock("bin:1").is_locked().await;
    let out = rlock(&s.url(), &["inspect", "bin:1"]);
    assert!(
        matches!(r, Err(Error::NotALock { .. })) && out.status.code() == Some(4),
        "is_locked = {r:?}; inspect exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A hash keyed by `<uuid>:<anything>` with JSON values (carts, sessions) is data:
/// `lock()` refuses it at once and `force_unlock` leaves it.
#[tokio::test]
async fn a_uuid_keyed_application_hash_is_data() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let _: () = s.cmd(&[
        "HSET",
        "carts",
        "6f1c1a52-3c1e-4d8a-9b7e-0a1b2c3d4e5f:items",
        "{\"sku\":42}",
    ]);
    let before = fields(&s, "carts");
    let waited = tokio::time::timeout(Duration::from_secs(2), c.lock("carts").lock()).await;
    let forced = c.lock("carts").force_unlock().await;
    assert_eq!(
        fields(&s, "carts"),
        before,
        "lock() waited: {}; force_unlock = {forced:?}",
        waited.is_err()
    );
}

/// A live holder whose command connection was dropped (server `timeout`, a proxy,
/// CLIENT KILL) has no named connection until it sends a command: `inspect` must not
/// claim its process died.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_holder_with_a_dropped_connection_is_not_called_dead() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let g = c
        .lock("job:1")
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let id = c.id().to_string();
    let _: i64 = s.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    // The client is alive and holds the lock; give its manager time to reconnect.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let names: String = s.cmd(&["CLIENT", "LIST"]);
    let out = rlock_async(s.url(), &["inspect", "job:1"]).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // Nothing tells a dropped connection from a dead process until the client sends a
    // command: the text must not claim the process died.
    assert!(
        !text.contains("not connected") || text.contains("connection dropped"),
        "live holder {id} called dead:\n{text}\nCLIENT LIST:\n{names}"
    );
    g.unlock().await.unwrap();
}

/// An ACL user without CLIENT (no CLIENT SETNAME) still locks, also after a reconnect.
#[tokio::test]
async fn an_acl_without_client_still_locks() {
    let s = RedisServer::start();
    let _: () = s.cmd(&[
        "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-client",
    ]);
    let c = Client::connect(format!("redis://app:pw@127.0.0.1:{}", s.port))
        .await
        .unwrap();
    c.lock("a").lock().await.unwrap().unlock().await.unwrap();
    let _: i64 = s.cmd(&["CLIENT", "KILL", "USER", "app"]);
    let g = tokio::time::timeout(Duration::from_secs(5), c.lock("a").lock())
        .await
        .expect("no hang")
        .unwrap();
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_urls_work_in_the_cli() {
    let s = RedisServer::start();
    let url = s.url().replace("redis://", "valkey://");
    let c = Client::connect(&url).await.unwrap();
    let guard = c.lock("cli:valkey").lock().await.unwrap();
    let listed = rlock_async(url.clone(), &["list", "cli:valkey*"]).await;
    assert_eq!(
        listed.status.code(),
        Some(0),
        "{}",
        cli_common::stderr(&listed)
    );
    assert!(cli_common::stdout(&listed).contains("cli:valkey"));
    let forced = rlock_async(url, &["force-unlock", "cli:valkey"]).await;
    assert_eq!(
        forced.status.code(),
        Some(0),
        "{}",
        cli_common::stderr(&forced)
    );
    assert_eq!(s.cmd::<i64>(&["EXISTS", "cli:valkey"]), 0);
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
}

/// `watch` listens by a pattern that matches the lock's channel alone: it hears the
/// unlock message of a name with glob characters, and `PUBSUB NUMSUB` does not count it,
/// so no release takes the watch for a waiter outside the line and yields to it
/// (`docs/protocol.md` 2.6). Before, it subscribed: counted, and a turn between two
/// clients then yielded 2 ms to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_hears_by_an_exact_pattern_and_is_not_counted() {
    const NAME: &str = "job[1]*?\\x";
    let (s, name) = (RedisServer::start(), NAME);
    let c = Client::connect(s.url()).await.unwrap();
    let lock = c.lock(name);
    let g = lock.lock().await.unwrap();
    let field = g.holder_field().to_string();
    let watching = tokio::spawn(rlock_async(s.url(), &["watch", NAME, "--for", "2"]));
    let patterns = common::eventually(Duration::from_secs(3), || {
        s.cmd::<i64>(&["PUBSUB", "NUMPAT"]) >= 2
    })
    .await;
    assert!(patterns, "the watch never listened");
    let channel = redis_rlock::protocol::channel_name(name);
    assert_eq!(
        s.numsub(&channel),
        0,
        "the watch is counted as a subscriber"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    g.unlock().await.unwrap();
    let out = watching.await.unwrap();
    let seen = events(&out);
    assert_eq!(seen, vec![("released".to_string(), field)], "{seen:#?}");
}
