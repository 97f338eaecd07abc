//! Graceful shutdown: `Client::shutdown` releases every hold, turns waiters away with
//! `Closed`, and stops the client's tasks; dropping the last handle stops them too.

mod common;

use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::{Client, Error};

async fn client(s: &RedisServer) -> Client {
    common::client_with(
        &s.url(),
        Duration::from_secs(30),
        Duration::from_millis(500),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_every_hold_and_turns_waiters_away() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let other = client(&s).await;
    let held = c.lock("sd:held").lock().await.unwrap();
    let _nested = c.lock("sd:held").lock().await.unwrap();
    let fixed = c
        .lock("sd:fixed")
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    // A guard dropped right before shutdown: its release is still on its way.
    drop(c.lock("sd:dropped").lock().await.unwrap());
    // A waiter of this client, and one of another client, on the held lock.
    let mine = {
        let l = c.lock("sd:held");
        tokio::spawn(async move { l.lock().await })
    };
    let theirs = {
        let l = other.lock("sd:held");
        tokio::spawn(async move {
            let g = l.try_lock_for(Duration::from_secs(10), None).await;
            (g, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    let t = Instant::now();
    c.shutdown().await.unwrap();
    let took = t.elapsed();
    println!("FIGURE shutdown_took {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // Nothing of this client is left in Redis, at once.
    for name in ["sd:fixed", "sd:dropped"] {
        assert_eq!(s.cmd::<i64>(&["EXISTS", name]), 0, "{name} still held");
    }
    let fields: Vec<String> = s.cmd(&["HKEYS", "sd:held"]);
    assert!(
        fields.iter().all(|f| !f.starts_with(c.id())),
        "a hold of the shut-down client remains: {fields:?}"
    );
    // The waiter of this client left with Closed; the other client's got the lock.
    let r = tokio::time::timeout(Duration::from_secs(2), mine)
        .await
        .expect("the waiter was not turned away")
        .unwrap();
    assert!(matches!(r, Err(Error::Closed)), "{r:?}");
    let (g, at) = tokio::time::timeout(Duration::from_secs(5), theirs)
        .await
        .unwrap()
        .unwrap();
    let g = g
        .unwrap()
        .expect("the other client's waiter got the released lock");
    println!("FIGURE shutdown_other_waiter_served_after {:?}", at - t);
    g.unlock().await.unwrap();
    // Guards still alive know, and the client takes nothing any more.
    assert!(held.is_lost());
    assert!(fixed.is_lost());
    assert!(matches!(held.unlock().await, Err(Error::Closed)));
    assert!(matches!(c.lock("sd:new").lock().await, Err(Error::Closed)));
    assert!(matches!(
        c.lock("sd:new").try_lock().await,
        Err(Error::Closed)
    ));
    assert_eq!(s.cmd::<i64>(&["EXISTS", "sd:new"]), 0);
    // Nothing else goes to Redis either.
    assert!(matches!(
        c.lock("sd:new").is_locked().await,
        Err(Error::Closed)
    ));
    assert!(matches!(
        c.lock("sd:new").force_unlock().await,
        Err(Error::Closed)
    ));
    drop(fixed);
    // A second call is harmless.
    c.shutdown().await.unwrap();
}

/// Runs `f` on a fresh runtime and returns how many tasks it still had alive, beyond
/// those alive before, 200 ms after `f` returned.
fn tasks_left_after(f: impl AsyncFnOnce(&RedisServer)) -> usize {
    let s = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let before = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        f(&s).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        after.saturating_sub(before)
    })
}

/// Uses a client the way a service does: locks, a waiter on the pub/sub connection, a
/// dropped guard.
async fn use_client(s: &RedisServer) -> Client {
    let c = client(s).await;
    let g = c.lock("sd:busy").lock().await.unwrap();
    let waiter = {
        let l = c.lock("sd:busy");
        tokio::spawn(async move { l.lock().await.map(drop) })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(g);
    waiter.await.unwrap().unwrap();
    drop(c.lock("sd:other").lock().await.unwrap());
    c
}

#[test]
fn no_task_of_the_client_is_alive_after_shutdown() {
    let left = tasks_left_after(async |s| {
        let c = use_client(s).await;
        c.shutdown().await.unwrap();
        drop(c);
    });
    assert_eq!(left, 0, "tasks still alive after shutdown");
}

#[test]
fn dropping_the_last_handle_stops_the_clients_tasks_promptly() {
    let left = tasks_left_after(async |s| {
        let c = use_client(s).await;
        // Let the dropped guard's release finish.
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(c);
    });
    assert_eq!(
        left, 0,
        "tasks still alive after the last handle was dropped"
    );
}
