//! Who owns a blocking call's hold inside tokio: the task, as for an async call there
//! (`OwnerId::current`), not the OS thread, whose tasks (a worker's) or closures
//! (`spawn_blocking`'s pool) come and go while a hold is kept. Plain threads stay
//! thread-owned.
//!
//! Run with `cargo test --features blocking --test blocking_owners`.

#![cfg(feature = "blocking")]

mod common;

use std::time::Duration;

use common::RedisServer;
use redis_rlock::blocking::Client;
use redis_rlock::OwnerId;

/// Two tasks that run on one worker, the second while the first keeps a blocking guard
/// across an `.await`, are two owners: the second does not re-enter.
#[test]
fn two_tasks_on_one_worker_thread_do_not_both_hold_a_blocking_lock() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let name = "bo:worker";
    let (a_thread, b_thread, b_got) = rt.block_on(async {
        let c = client.clone();
        let a = tokio::spawn(async move {
            let guard = c.lock(name).lock().unwrap();
            assert_eq!(guard.owner(), OwnerId::current(), "the task owns it");
            assert!(matches!(guard.owner(), OwnerId::Task(_)));
            let here = std::thread::current().id();
            // Holds across an await, as async code with a blocking guard may.
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(guard);
            here
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Bounded: 20 tries within A's 300 ms hold; any that lands on A's thread shows it.
        let mut seen = (std::thread::current().id(), false);
        for _ in 0..20 {
            let c = client.clone();
            let b = tokio::spawn(async move {
                let got = c.lock(name).try_lock().unwrap();
                (std::thread::current().id(), got.is_some())
            })
            .await
            .unwrap();
            seen = b;
            if b.1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (a.await.unwrap(), seen.0, seen.1)
    });
    assert!(
        !b_got,
        "two tasks held the blocking lock at once (a on {a_thread:?}, b on {b_thread:?})"
    );
    assert!(!client.lock(name).is_locked().unwrap());
}

/// A guard that a `spawn_blocking` closure hands back outlives the closure; the next
/// closures, which the pool runs on the thread it freed, are owners of their own.
#[test]
fn a_guard_returned_from_spawn_blocking_excludes_later_closures() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let name = "bo:pool";
    rt.block_on(async {
        let c = client.clone();
        let (guard, first) = tokio::task::spawn_blocking(move || {
            (c.lock(name).lock().unwrap(), std::thread::current().id())
        })
        .await
        .unwrap();
        for i in 0..5 {
            let c = client.clone();
            let (got, here) = tokio::task::spawn_blocking(move || {
                let g = c.lock(name).try_lock().unwrap();
                (g.is_some(), std::thread::current().id())
            })
            .await
            .unwrap();
            assert!(
                !got,
                "closure {i} on {here:?} got the lock the first closure (on {first:?}) \
                 handed back"
            );
        }
        tokio::task::spawn_blocking(move || guard.unlock().unwrap())
            .await
            .unwrap();
    });
    assert!(!client.lock(name).is_locked().unwrap());
}

/// Outside tokio the thread is the owner, as in Redisson: nested calls re-enter, another
/// thread waits.
#[test]
fn plain_threads_stay_thread_owned() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).unwrap();
    let lock = client.lock("bo:thread");
    let outer = lock.lock().unwrap();
    assert_eq!(outer.owner(), OwnerId::current_thread());
    let inner = lock.try_lock().unwrap().expect("re-enters on this thread");
    std::thread::scope(|sc| {
        assert!(sc
            .spawn(|| lock.try_lock().unwrap().is_none())
            .join()
            .unwrap());
    });
    inner.unlock().unwrap();
    outer.unlock().unwrap();
    assert!(!lock.is_locked().unwrap());
}
