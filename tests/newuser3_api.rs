//! More of the third newcomer's programs (see `tests/newuser3.rs`): the blocking client
//! (feature `blocking`) where its module doc says it runs and where it refuses, the
//! README's semaphore and latch example, and its RedLock over three servers.
//!
//! The blocking tests run with `cargo test --features blocking --test newuser3_api`.

mod common;

use std::time::Duration;

use common::RedisServer;
use redis_rlock::Client;

/// The blocking client through `redis_rlock::blocking`: re-entry per thread, another
/// thread kept out for its whole wait, a dropped guard released before `drop` returns,
/// and its stats.
#[cfg(feature = "blocking")]
#[test]
fn the_blocking_client_as_its_module_doc_shows() {
    use redis_rlock::blocking::Client;
    let s = RedisServer::start();
    let client = Client::connect(s.url()).unwrap();
    let lock = client.lock("nu3:blocking");

    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 2, "same thread: hold count 2");
    assert!(lock.is_held_by_current_thread().unwrap());
    std::thread::scope(|scope| {
        scope.spawn(|| {
            assert!(!lock.is_held_by_current_thread().unwrap());
            let t0 = std::time::Instant::now();
            let got = lock.try_lock_for(Duration::from_millis(300), None).unwrap();
            assert!(got.is_none(), "another thread got in while held");
            assert!(t0.elapsed() >= Duration::from_millis(290));
        });
    });
    inner.unlock().unwrap();
    outer.unlock().unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu3:blocking"]), 0);

    let guard = lock
        .try_lock_for(Duration::from_millis(500), None)
        .unwrap()
        .expect("free");
    drop(guard);
    assert_eq!(
        s.cmd::<i64>(&["EXISTS", "nu3:blocking"]),
        0,
        "dropping released before it returned"
    );
    let st = client.stats();
    assert_eq!((st.acquisitions, st.releases), (3, 3), "{st:?}");
    client.shutdown().unwrap();
}

/// The blocking client where its module doc says: on a thread that drives a
/// current-thread runtime a call is a typed error that sends nothing (no panic, no
/// stalled runtime); on a multi-thread runtime's worker it runs (`block_in_place`).
#[cfg(feature = "blocking")]
#[test]
fn the_blocking_client_refuses_a_current_thread_runtime_and_runs_on_a_worker() {
    let s = RedisServer::start();
    let client = redis_rlock::blocking::Client::connect(s.url()).unwrap();
    let lock = client.lock("nu3:worker");
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = current
        .block_on(async { lock.lock().map(drop) })
        .unwrap_err();
    assert!(
        matches!(err, redis_rlock::Error::BlockingNotAllowed),
        "{err:?}"
    );
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu3:worker"]), 0, "sent nothing");

    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let on_worker = {
        let lock = lock.clone();
        multi.spawn(async move { lock.lock().and_then(|g| g.unlock()) })
    };
    multi
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), on_worker).await })
        .expect("the worker blocked for 5 s")
        .unwrap()
        .unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu3:worker"]), 0);
    client.shutdown().unwrap();
}

/// The README's semaphore and latch example, with its comments checked in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_semaphore_and_latch_example_does_what_it_says() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();

    let exports = client.semaphore("nu3:exports");
    assert!(exports.try_set_permits(3).await.unwrap());
    assert!(
        !exports.try_set_permits(5).await.unwrap(),
        "only if it does not exist yet"
    );
    assert_eq!(s.cmd::<String>(&["GET", "nu3:exports"]), "3");
    assert!(exports
        .try_acquire_for(1, Duration::from_secs(2))
        .await
        .unwrap());
    assert_eq!(s.cmd::<String>(&["GET", "nu3:exports"]), "2");
    let mut sub = s.conn();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("redisson_sc:{nu3:exports}").unwrap();
    exports.release(1).await.unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let msg = pubsub.get_message().expect("release publishes");
    assert_eq!(msg.get_channel_name(), "redisson_sc:{nu3:exports}");
    assert_eq!(s.cmd::<String>(&["GET", "nu3:exports"]), "3");

    let seats = client.permit_expirable_semaphore("nu3:seats");
    assert!(seats.try_set_permits(10).await.unwrap());
    let permit = seats.acquire(Duration::from_secs(30)).await.unwrap();
    assert_eq!(seats.available_permits().await.unwrap(), 9);
    seats.release(permit.id()).await.unwrap();
    assert_eq!(seats.available_permits().await.unwrap(), 10);

    let ready = client.count_down_latch("nu3:workers-ready");
    assert!(ready.try_set_count(2).await.unwrap());
    ready.count_down().await.unwrap();
    assert!(!ready.wait_for(Duration::from_millis(50)).await.unwrap());
    ready.count_down().await.unwrap();
    assert!(ready.wait_for(Duration::from_secs(1)).await.unwrap());
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu3:workers-ready"]), 0);
    client.shutdown().await.unwrap();
}

/// The README's RedLock over three independent servers: a majority grants it, a second
/// RedLock on the same name is kept out, and with one server stopped the other two still
/// make a majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_redlock_takes_a_majority_of_three_servers() {
    use redis_rlock::RedLock;
    let mut servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for s in &servers {
        ours.push(
            Client::connect(s.url())
                .await
                .unwrap()
                .lock("nu3:orders:42"),
        );
        theirs.push(
            Client::connect(s.url())
                .await
                .unwrap()
                .lock("nu3:orders:42"),
        );
    }
    let ours = RedLock::new(ours).unwrap();
    let theirs = RedLock::new(theirs).unwrap();
    assert_eq!(ours.quorum(), 2);

    let g = ours
        .try_lock_for(Duration::from_secs(1), None)
        .await
        .unwrap()
        .expect("three free servers");
    for s in &servers {
        assert_eq!(s.cmd::<i64>(&["EXISTS", "nu3:orders:42"]), 1);
    }
    assert!(theirs
        .try_lock_for(Duration::from_millis(200), None)
        .await
        .unwrap()
        .is_none());
    g.unlock().await.unwrap();
    for s in &servers {
        assert_eq!(s.cmd::<i64>(&["EXISTS", "nu3:orders:42"]), 0);
    }

    servers[2].kill();
    let g = tokio::time::timeout(
        Duration::from_secs(10),
        theirs.try_lock_for(Duration::from_secs(2), None),
    )
    .await
    .expect("a RedLock with a server down took 10 s")
    .unwrap()
    .expect("two of three servers are a majority");
    assert_eq!(servers[0].cmd::<i64>(&["EXISTS", "nu3:orders:42"]), 1);
    g.unlock().await.unwrap();
    assert_eq!(servers[0].cmd::<i64>(&["EXISTS", "nu3:orders:42"]), 0);
}
