//! Leases as a second newcomer met them, each on a real redis-server: a fixed lease left
//! alone when the watchdog holds around it are released, and a lease with a fraction of
//! a millisecond (two findings, fixed).

mod common;

use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::{Client, Error};

/// A fixed lease taken inside a watchdog hold, the watchdog hold released first: the
/// lock must then end with the fixed lease ("expires `lease` after it was taken"), not
/// stay for the watchdog's 30 s while its guard reports itself lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_left_alone_ends_when_its_lease_does() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let other = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu2:left");
    let outer = lock.lock().await.unwrap();
    let f = lock
        .lock_with_lease(Duration::from_millis(600))
        .await
        .unwrap();
    outer.unlock().await.unwrap();
    let pttl: i64 = s.cmd(&["PTTL", "nu2:left"]);
    assert!(
        pttl > 0 && pttl <= 601,
        "left at the watchdog's lease: {pttl} ms"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(f.is_lost());
    assert!(other.lock("nu2:left").try_lock().await.unwrap().is_some());
    drop(f);

    // The fixed lease ran out while the watchdog hold covered it: releasing the watchdog
    // hold frees the lock at once, and publishes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let outer = lock.lock().await.unwrap();
    let f = lock
        .lock_with_lease(Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!f.is_lost(), "covered by the watchdog hold");
    outer.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu2:left"]), 0, "held past both");
    assert!(f.is_lost());
    assert!(matches!(f.unlock().await, Err(Error::LeaseLost { .. })));
    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// Redis counts a lease in whole milliseconds; a guard must not count the fraction it
/// was given on top: `is_lost()` turns true no later than the key can expire on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fractional_lease_is_lost_no_later_than_its_key_expires() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu2:frac");
    let mut conn = s.conn();
    let mut late = 0;
    for _ in 0..60 {
        // A grant that came back after its lease is a typed error: try again.
        let Ok(Some(g)) = lock.try_lock_with_lease(Duration::from_micros(1_900)).await else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let t = Instant::now();
        while redis::cmd("EXISTS")
            .arg("nu2:frac")
            .query::<i64>(&mut conn)
            .unwrap()
            == 1
        {
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "the key outlived its lease"
            );
        }
        if !g.is_lost() {
            late += 1;
        }
        drop(g);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(
        late, 0,
        "guards not lost though their key had expired: {late} of 60"
    );
    client.shutdown().await.unwrap();
}
