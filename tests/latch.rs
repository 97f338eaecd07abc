//! The count-down latch on a real server: every waiter, of several clients, wakes at
//! zero through Redisson's channel and message; a Redisson peer (its scripts typed in
//! by hand from the facts) counts down and hears ours; waits keep their bounds; a
//! dropped wait leaves no subscription.

mod common;

use std::time::{Duration, Instant};

use common::{client_with, eventually, RedisServer};
use redis_rlock::{protocol, Error};

const LONG: Duration = Duration::from_secs(30);

/// Redisson's `RCountDownLatch.countDown()`.
fn redisson_count_down(conn: &mut redis::Connection, name: &str) {
    let script = redis::Script::new(
        r"
        local left = redis.call('decr', KEYS[1])
        if left <= 0 then redis.call('del', KEYS[1]) end
        if left == 0 then redis.call(ARGV[2], KEYS[2], ARGV[1]) end",
    );
    let _: () = script
        .key(name)
        .key(protocol::latch_channel(name))
        .arg(0)
        .arg("publish")
        .invoke(conn)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_waiter_of_every_client_wakes_at_zero() {
    let s = RedisServer::start();
    let a = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
    let b = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
    let name = "latch:all";
    let latch = a.count_down_latch(name);
    assert!(latch.try_set_count(3).await.unwrap());
    assert!(!latch.try_set_count(5).await.unwrap(), "set twice");
    assert_eq!(latch.count().await.unwrap(), 3);

    let mut waiters = Vec::new();
    for i in 0..6 {
        let l = if i % 2 == 0 { &a } else { &b }.count_down_latch(name);
        waiters.push(tokio::spawn(async move {
            if i < 3 {
                l.wait().await.map(|_| true)
            } else {
                l.wait_for(Duration::from_secs(20)).await
            }
        }));
    }
    let channel = protocol::latch_channel(name);
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 2).await);
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A Redisson-like subscriber hears the zero message.
    let mut sub = redis::Client::open(s.url())
        .unwrap()
        .get_connection()
        .unwrap();
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut ps = sub.as_pubsub();
    ps.subscribe(&channel).unwrap();

    assert_eq!(latch.count_down().await.unwrap(), 2);
    let mut peer = s.conn();
    redisson_count_down(&mut peer, name);
    assert_eq!(latch.count().await.unwrap(), 1);
    for w in &waiters {
        assert!(!w.is_finished(), "a waiter left before zero");
    }
    let t = Instant::now();
    assert_eq!(b.count_down_latch(name).count_down().await.unwrap(), 0);
    let msg = ps.get_message().unwrap();
    assert_eq!(
        msg.get_payload::<String>().unwrap(),
        protocol::LATCH_ZERO_MESSAGE
    );
    for w in waiters {
        let r = tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .unwrap()
            .unwrap();
        assert!(r.unwrap());
    }
    // The 30 s recheck period cannot explain this: the message woke all six.
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(s.cmd::<i64>(&["EXISTS", name]), 0);
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 1).await);
    // Counting down an absent latch writes nothing.
    assert_eq!(latch.count_down().await.unwrap(), 0);
    assert_eq!(s.cmd::<i64>(&["EXISTS", name]), 0);
    // Waiting on an absent latch returns at once.
    assert!(latch.wait_for(Duration::ZERO).await.unwrap());
    // Setting a count publishes Redisson's "new count".
    latch.try_set_count(1).await.unwrap();
    let msg = ps.get_message().unwrap();
    assert_eq!(
        msg.get_payload::<String>().unwrap(),
        protocol::LATCH_NEW_COUNT_MESSAGE
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_wait_returns_in_time_and_a_dropped_one_leaves_no_subscription() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
    let latch = c.count_down_latch("latch:bounds");
    latch.try_set_count(1).await.unwrap();
    let t = Instant::now();
    assert!(!latch.wait_for(Duration::from_millis(300)).await.unwrap());
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(600),
        "{took:?}"
    );
    assert!(!latch.wait_for(Duration::ZERO).await.unwrap());

    let channel = protocol::latch_channel("latch:bounds");
    let waiter = {
        let l = latch.clone();
        tokio::spawn(async move { l.wait().await })
    };
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 1).await);
    waiter.abort();
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 0).await);

    // Typed errors before anything is sent.
    assert!(matches!(
        c.count_down_latch("latch:zero").try_set_count(0).await,
        Err(Error::InvalidCount { what: "count", .. })
    ));
    assert_eq!(s.cmd::<i64>(&["EXISTS", "latch:zero"]), 0);
    assert!(matches!(
        c.count_down_latch("").count().await,
        Err(Error::EmptyName)
    ));
    let _: () = s.cmd(&["HSET", "latch:hash", "f", "1"]);
    assert!(matches!(
        c.count_down_latch("latch:hash")
            .wait_for(Duration::from_millis(50))
            .await,
        Err(Error::WrongType { .. })
    ));
}
