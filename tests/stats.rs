//! `Client::stats`: what a client counts, on a real server.

mod common;

use std::time::Duration;

use common::RedisServer;
use redis_rlock::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_acquisitions_busy_replies_releases_wakeups_renewals_and_losses() {
    let s = RedisServer::start();
    let c = common::client_with(
        &s.url(),
        Duration::from_millis(600),
        Duration::from_millis(500),
    )
    .await;
    let other = Client::connect(s.url()).await.unwrap();
    assert_eq!(c.stats(), redis_rlock::Stats::default());

    let lock = c.lock("st:a");
    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    inner.unlock().await.unwrap();
    let st = c.stats();
    assert_eq!(st.acquisitions, 2, "{st:?}");
    assert_eq!(st.releases, 1, "{st:?}");

    // A waiter of another client: busy, then woken by the unlock.
    let waiting = tokio::spawn({
        let l = other.lock("st:a");
        async move { l.lock().await.unwrap().unlock().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(c.stats().renewals >= 1, "held past a renewal period");
    outer.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    let o = other.stats();
    assert!(o.busy >= 1, "{o:?}");
    assert!(o.wakeups >= 1, "{o:?}");
    assert_eq!(o.acquisitions, 1, "{o:?}");
    assert!(o.pubsub_connects >= 1, "{o:?}");

    // A hand-over between two tasks of one client.
    let g = lock.lock().await.unwrap();
    let waiter = tokio::spawn({
        let l = c.lock("st:a");
        async move { l.lock().await.unwrap().unlock().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = c.stats().handovers;
    g.unlock().await.unwrap();
    waiter.await.unwrap();
    assert_eq!(c.stats().handovers, before + 1);

    // A loss: the key deleted under a held lock.
    let g = lock.lock().await.unwrap();
    let _: () = s.cmd(&["DEL", "st:a"]);
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .unwrap();
    assert_eq!(c.stats().leases_lost, 1);
    drop(g);
}
