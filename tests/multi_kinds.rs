//! A MultiLock over parts of one name of different kinds: both halves of one read-write
//! lock are two holds (the whole holds the lock alone), and a name used both as a
//! read-write lock and as a plain lock is refused.

mod common;

use std::time::Duration;

use common::RedisServer;
use redis_rlock::{Client, Error, MultiLock, OwnerId};

/// Both given orders hold the write half: the whole answers with two parts, another
/// client's reader and writer stay out while it is held and get in after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_over_read_and_write_holds_the_write_half() {
    let s = RedisServer::start();
    let a = Client::builder(s.url()).build().await.unwrap();
    let b = Client::builder(s.url()).build().await.unwrap();
    let name = "multi:rw";
    let rw = a.read_write_lock(name);
    for (order, parts) in [
        ("[read, write]", vec![rw.read(), rw.write()]),
        ("[write, read]", vec![rw.write(), rw.read()]),
    ] {
        let multi = MultiLock::new(parts).unwrap();
        let guard = OwnerId::scope(async {
            tokio::time::timeout(Duration::from_secs(5), multi.lock()).await
        })
        .await
        .unwrap_or_else(|_| panic!("{order}: lock() did not answer in 5 s"))
        .unwrap_or_else(|e| panic!("{order}: lock() failed: {e:?}"));
        let parts = guard.parts().len();
        assert_eq!(
            parts, 2,
            "{order}: the whole holds {parts} part(s), not both halves"
        );
        let other = b.read_write_lock(name);
        let reader = other.read().try_lock().await.unwrap();
        assert!(
            reader.is_none(),
            "{order}: the multi-lock answered Ok with {parts} part(s), yet another \
             client's reader got in: it holds no write lock"
        );
        assert!(other.write().try_lock().await.unwrap().is_none(), "{order}");
        guard.unlock().await.unwrap();
        let reader = other.read().try_lock().await.unwrap();
        assert!(reader.is_some(), "{order}: still held after unlock");
        reader.unwrap().unlock().await.unwrap();
    }
}

/// A part given twice is taken once, as before: one guard, hold count 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_part_is_taken_once() {
    let s = RedisServer::start();
    let a = Client::builder(s.url()).build().await.unwrap();
    let rw = a.read_write_lock("multi:rw:twice");
    let multi = MultiLock::new(vec![rw.write(), rw.write(), rw.read()]).unwrap();
    let guard = multi.try_lock().await.unwrap().expect("free");
    assert_eq!(guard.parts().len(), 2);
    guard.unlock().await.unwrap();
}

/// One name as a read-write half and as a plain (or fair) lock is a layout clash: a typed
/// error at construction, nothing sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_both_read_write_and_plain_is_refused() {
    let s = RedisServer::start();
    let a = Client::builder(s.url()).build().await.unwrap();
    let name = "multi:clash";
    for parts in [
        vec![a.read_write_lock(name).read(), a.lock(name)],
        vec![a.fair_lock(name), a.read_write_lock(name).write()],
    ] {
        match MultiLock::new(parts) {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains(name), "{msg}"),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }
}
