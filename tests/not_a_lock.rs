//! A name that holds application data is never taken for a lock: the library refuses to
//! wait on it, to report it locked, or to delete it, with `Error::NotALock`, and leaves
//! every field as it was.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::{Client, Error};

/// The whole hash at `key`, to compare before and after.
fn fields(s: &RedisServer, key: &str) -> BTreeMap<String, String> {
    s.cmd(&["HGETALL", key])
}

fn app_hash(s: &RedisServer, key: &str) -> BTreeMap<String, String> {
    let _: () = s.cmd(&["HSET", key, "name", "alice", "email", "a@x"]);
    fields(s, key)
}

fn is_not_a_lock<T: std::fmt::Debug>(r: redis_rlock::Result<T>, key: &str) {
    match r {
        Err(Error::NotALock { key: k }) => assert_eq!(k, key),
        other => panic!("expected NotALock for {key}, got {other:?}"),
    }
}

#[tokio::test]
async fn force_unlock_leaves_an_application_hash_alone() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let before = app_hash(&s, "user:1");
    is_not_a_lock(c.lock("user:1").force_unlock().await, "user:1");
    is_not_a_lock(c.fair_lock("user:1").force_unlock().await, "user:1");
    let rw = c.read_write_lock("user:1");
    is_not_a_lock(rw.read().force_unlock().await, "user:1");
    is_not_a_lock(rw.write().force_unlock().await, "user:1");
    assert_eq!(fields(&s, "user:1"), before);
}

#[tokio::test]
async fn a_mode_field_without_a_holder_is_no_lock() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let _: () = s.cmd(&["HSET", "prefs:1", "mode", "read"]);
    let before = fields(&s, "prefs:1");
    is_not_a_lock(c.lock("prefs:1").force_unlock().await, "prefs:1");
    let rw = c.read_write_lock("prefs:1");
    is_not_a_lock(rw.read().force_unlock().await, "prefs:1");
    is_not_a_lock(rw.read().try_lock().await, "prefs:1");
    assert_eq!(fields(&s, "prefs:1"), before);
}

#[tokio::test]
async fn lock_on_an_application_hash_fails_at_once() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let before = app_hash(&s, "user:2");
    let started = Instant::now();
    let lock = c.lock("user:2");
    let waited = tokio::time::timeout(Duration::from_secs(5), lock.lock()).await;
    is_not_a_lock(
        waited.expect("lock() waited on data nobody releases"),
        "user:2",
    );
    is_not_a_lock(lock.try_lock().await, "user:2");
    is_not_a_lock(
        lock.try_lock_for(Duration::from_secs(1), None).await,
        "user:2",
    );
    is_not_a_lock(lock.is_locked().await, "user:2");
    let fair = c.fair_lock("user:2");
    let waited = tokio::time::timeout(Duration::from_secs(5), fair.lock()).await;
    is_not_a_lock(waited.expect("a fair lock() waited on data"), "user:2");
    let rw = c.read_write_lock("user:2");
    let waited = tokio::time::timeout(Duration::from_secs(5), rw.write().lock()).await;
    is_not_a_lock(waited.expect("a write lock() waited on data"), "user:2");
    let waited = tokio::time::timeout(Duration::from_secs(5), rw.read().lock()).await;
    is_not_a_lock(waited.expect("a read lock() waited on data"), "user:2");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(fields(&s, "user:2"), before);
    // Nothing of ours was left behind at the name either.
    let keys: Vec<String> = s.cmd(&["KEYS", "*"]);
    assert_eq!(keys, ["user:2"], "keys left: {keys:?}");
}

#[tokio::test]
async fn a_lock_is_still_a_lock() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let other = Client::connect(s.url()).await.unwrap();
    let guard = c.lock("orders:1").lock().await.unwrap();
    assert!(other.lock("orders:1").is_locked().await.unwrap());
    assert!(other.lock("orders:1").try_lock().await.unwrap().is_none());
    // A plain lock under a read-write lock's name is busy, and keeps its shape.
    let rw = other.read_write_lock("orders:1");
    assert!(rw.read().try_lock().await.unwrap().is_none());
    assert!(rw.write().try_lock().await.unwrap().is_none());
    let held = fields(&s, "orders:1");
    assert_eq!(held.keys().collect::<Vec<_>>(), [guard.holder_field()]);
    assert!(other.lock("orders:1").force_unlock().await.unwrap());
    assert!(!other.lock("orders:1").is_locked().await.unwrap());
    let w = c.read_write_lock("rw:1").write().lock().await.unwrap();
    assert!(other
        .read_write_lock("rw:1")
        .write()
        .force_unlock()
        .await
        .unwrap());
    drop(w);
}
