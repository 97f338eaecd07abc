//! Clients with a turn window, the line of a lock, and waiter tasks that say when they
//! were served: the setup the tests of turns (`tests/turns*.rs`, `tests/adv_yield*.rs`,
//! `tests/adv_layout.rs`, `tests/names.rs`) share.

use std::time::{Duration, Instant};

use redis_rlock::{Client, Lock};

use super::RedisServer;

/// A client of `s` with this turn window, every other setting the default.
pub async fn client(s: &RedisServer, window: Duration) -> Client {
    Client::builder(s.url())
        .turn_window(window)
        .build()
        .await
        .unwrap()
}

/// The client ids in `name`'s line, first in line first.
pub fn line(s: &RedisServer, name: &str) -> Vec<String> {
    s.cmd(&[
        "LRANGE",
        &redis_rlock::protocol::clients_key(name),
        "0",
        "-1",
    ])
}

/// Polls every 5 ms until `id` is in `name`'s line; panics after 5 s.
pub async fn lined_up(s: &RedisServer, name: &str, id: &str) {
    let until = Instant::now() + Duration::from_secs(5);
    while !line(s, name).iter().any(|c| c == id) {
        assert!(Instant::now() < until, "{id} never lined up for {name}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A task that waits for `lock`, releases it at once, and returns when it got it.
pub fn take_and_release(lock: Lock) -> tokio::task::JoinHandle<Instant> {
    tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    })
}

/// What `task` returned, waited for at most `limit`; panics with `what` (and the
/// timeout) past it.
pub async fn served<T>(
    task: tokio::task::JoinHandle<T>,
    limit: Duration,
    what: impl std::fmt::Display,
) -> T {
    tokio::time::timeout(limit, task)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
        .unwrap()
}

/// `holder` takes its lock, a task of `waiter` waits 100 ms for it, and the holder
/// releases: how long after the release the waiter got it ([`served`] within `limit`,
/// or a panic with `what`).
pub async fn handed_on(
    holder: &Lock,
    waiter: Lock,
    limit: Duration,
    what: impl std::fmt::Display,
) -> Duration {
    let held = holder.lock().await.unwrap();
    let w = take_and_release(waiter);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    held.unlock().await.unwrap();
    let got = served(w, limit, what).await;
    got.duration_since(released)
}

/// `lock()` of `lock`, which nothing should hold off, returns within `limit` (else a
/// panic); the guard is unlocked.
pub async fn takes_within(lock: &Lock, limit: Duration) {
    let g = tokio::time::timeout(limit, lock.lock())
        .await
        .unwrap_or_else(|e| panic!("lock() of a free lock returned within {limit:?}: {e:?}"))
        .unwrap();
    g.unlock().await.unwrap();
}

/// [`handed_on`] of `name` from a task of `holder` to a task of `waiter` (served within
/// 5 s), asserting the waiter got the lock less than `bound` after the release; `who`
/// names the waiter in a failure.
pub async fn hands_on_within(
    holder: &Client,
    waiter: &Client,
    name: &str,
    bound: Duration,
    who: impl std::fmt::Display,
) {
    let (held, waiting) = (holder.lock(name), waiter.lock(name));
    let within = Duration::from_secs(5);
    let took = handed_on(&held, waiting, within, "the waiter got the lock within 5 s").await;
    assert!(took < bound, "{who} took {took:?} after the release");
}
