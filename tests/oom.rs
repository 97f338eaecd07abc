//! A release never depends on a write the plain release does not need: with Redis out of
//! memory (`maxmemory` reached, `noeviction`), an unlock still frees the lock, whether a
//! waiter of another client or of the same client waits for it.

mod common;

use std::time::Duration;

use common::RedisServer;
use redis_rlock::{Client, Lock};

/// Puts the server over its memory limit: every command that may grow memory is
/// refused with `OOM` from now on, deletes and publishes are not.
fn out_of_memory(s: &RedisServer) {
    let _: () = s.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let _: () = s.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let refused = s.try_cmd::<()>(&["SET", "probe", "x"]).unwrap_err();
    assert_eq!(refused.code(), Some("OOM"), "{refused}");
}

/// `holder` holds `name` while `waiter` waits for it; then memory runs out, and the
/// holder's unlock must succeed and free the lock.
async fn unlock_frees_the_lock_while_out_of_memory(s: &RedisServer, holder: Lock, waiter: Lock) {
    let guard = holder.lock().await.unwrap();
    let waiting = tokio::spawn(async move {
        let g = waiter.lock().await?;
        g.unlock().await
    });
    // Long enough for the waiter to have asked, found the lock busy, and gone to sleep.
    tokio::time::sleep(Duration::from_millis(300)).await;
    out_of_memory(s);
    let field = guard.holder_field().to_string();
    let released = guard.unlock().await;
    assert!(released.is_ok(), "the unlock failed: {released:?}");
    let name = holder.name().to_string();
    let left: std::collections::BTreeMap<String, String> = s.cmd(&["HGETALL", &name]);
    let _: () = s.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    // Free, or already the waiter's; never the old holder's.
    assert!(!left.contains_key(&field), "{left:?}");
    // With memory back, the waiter gets the lock (or its error under OOM was typed).
    let _ = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter slept on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_with_another_clients_waiter_succeeds_out_of_memory() {
    let s = RedisServer::start();
    let (a, b) = (
        Client::connect(s.url()).await.unwrap(),
        Client::connect(s.url()).await.unwrap(),
    );
    unlock_frees_the_lock_while_out_of_memory(&s, a.lock("oom:1"), b.lock("oom:1")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_with_its_own_clients_waiter_succeeds_out_of_memory() {
    let s = RedisServer::start();
    let a = Client::connect(s.url()).await.unwrap();
    unlock_frees_the_lock_while_out_of_memory(&s, a.lock("oom:2"), a.lock("oom:2")).await;
}
