//! The fair lock (Redisson's `RFairLock` layout) on a real server: first come, first
//! served across clients; a waiter that gives up leaves the queue; a live waiter is never
//! purged however long it waits; a crashed one is; a Redisson peer (its scripts typed in
//! by hand) and this crate queue behind and wake each other.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redisson_fair::FairPeer;
use common::RedisServer;
use parking_lot::Mutex;
use redis_rlock::protocol::{queue_key, timeout_key};
use redis_rlock::Client;

fn queue(s: &RedisServer, name: &str) -> Vec<String> {
    s.cmd(&["LRANGE", &queue_key(name), "0", "-1"])
}

fn deadlines(s: &RedisServer, name: &str) -> i64 {
    s.cmd(&["ZCARD", &timeout_key(name)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_several_clients_get_the_lock_in_the_order_they_came() {
    let s = RedisServer::start();
    let holder = Client::connect(s.url()).await.unwrap();
    let g = holder.fair_lock("fl:order").lock().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5 {
        let c = Client::connect(s.url()).await.unwrap();
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let g = c.fair_lock("fl:order").lock().await.unwrap();
            order.lock().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.unlock().await.unwrap();
        }));
        // Each in the queue before the next comes.
        let s = &s;
        assert!(
            common::eventually(Duration::from_secs(5), || queue(s, "fl:order").len()
                == i + 1)
            .await
        );
    }
    g.unlock().await.unwrap();
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .expect("a waiter was never served")
            .unwrap();
    }
    assert_eq!(*order.lock(), [0, 1, 2, 3, 4]);
    assert!(queue(&s, "fl:order").is_empty());
    assert_eq!(deadlines(&s, "fl:order"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_or_is_dropped_leaves_the_queue_at_once() {
    let s = RedisServer::start();
    let holder = Client::connect(s.url()).await.unwrap();
    let c = Client::connect(s.url()).await.unwrap();
    let g = holder.fair_lock("fl:leave").lock().await.unwrap();
    // A single try never joins.
    assert!(c.fair_lock("fl:leave").try_lock().await.unwrap().is_none());
    assert!(queue(&s, "fl:leave").is_empty());
    // Out of time.
    let got = c
        .fair_lock("fl:leave")
        .try_lock_for(Duration::from_millis(200), None)
        .await
        .unwrap();
    assert!(got.is_none());
    assert!(
        common::eventually(Duration::from_secs(2), || queue(&s, "fl:leave").is_empty()).await,
        "a waiter out of time kept its place: {:?}",
        queue(&s, "fl:leave")
    );
    // Dropped.
    let lock = c.fair_lock("fl:leave");
    let _ = tokio::time::timeout(Duration::from_millis(200), lock.lock()).await;
    assert!(
        common::eventually(Duration::from_secs(2), || queue(&s, "fl:leave").is_empty()
            && deadlines(&s, "fl:leave") == 0)
        .await,
        "a dropped waiter kept its place"
    );
    // So the next waiter is served as soon as the lock is released.
    let next = tokio::spawn({
        let l = c.fair_lock("fl:leave");
        async move { l.lock().await.unwrap().unlock().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    g.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), next)
        .await
        .expect("the next waiter waited for a place nobody held")
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(1));
}

/// A wait that runs out while its first attempt is still on its way: the attempt is
/// answered busy later, in the background, which puts the waiter in the queue; nobody
/// waits there, so it must leave again, or the next waiter waits behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_out_of_time_before_its_first_answer_leaves_no_place() {
    let s = RedisServer::start();
    let holder = Client::connect(s.url()).await.unwrap();
    let proxy = common::proxy::Proxy::start(s.port).await;
    let slow = Client::connect(proxy.url()).await.unwrap();
    let name = "fl:cut";
    let g = holder.fair_lock(name).lock().await.unwrap();
    proxy.set_latency(Duration::from_millis(150));
    let asked = Instant::now();
    let got = slow
        .fair_lock(name)
        .try_lock_for(Duration::from_millis(30), None)
        .await;
    assert!(
        asked.elapsed() < Duration::from_millis(140),
        "the wait outlived its bound"
    );
    assert!(matches!(
        got,
        Ok(None) | Err(redis_rlock::Error::Timeout { .. })
    ));
    // The attempt's answer comes back in the background meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set_latency(Duration::ZERO);
    assert!(
        common::eventually(Duration::from_secs(2), || queue(&s, name).is_empty()
            && deadlines(&s, name) == 0)
        .await,
        "the late busy answer left a place in the queue: {:?}",
        queue(&s, name)
    );
    let next = tokio::spawn({
        let l = holder.fair_lock(name);
        async move { l.lock().await.unwrap().unlock().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    g.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), next)
        .await
        .expect("the next waiter waited behind a place nobody held")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_waiter_outlasting_the_wait_timeout_keeps_its_place() {
    let s = RedisServer::start();
    // Deadlines given on joining: the holder's PTTL (under 0.9 s) + 1 s per place.
    let build = || {
        Client::builder(s.url())
            .watchdog_timeout(Duration::from_millis(900))
            .fair_lock_wait_timeout(Duration::from_secs(1))
            .build()
    };
    let holder = build().await.unwrap();
    let first = build().await.unwrap();
    let second = build().await.unwrap();
    let g = holder.fair_lock("fl:live").lock().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |c: Client, who: &'static str| {
        let order = order.clone();
        tokio::spawn(async move {
            let g = c.fair_lock("fl:live").lock().await.unwrap();
            order.lock().push(who);
            g.unlock().await.unwrap();
        })
    };
    let a = spawn(first, "first");
    assert!(common::eventually(Duration::from_secs(5), || queue(&s, "fl:live").len() == 1).await);
    let b = spawn(second, "second");
    assert!(common::eventually(Duration::from_secs(5), || queue(&s, "fl:live").len() == 2).await);
    // Well past those deadlines: Redisson would purge the first as dead (#3004).
    tokio::time::sleep(Duration::from_millis(4000)).await;
    assert_eq!(queue(&s, "fl:live").len(), 2, "a live waiter was purged");
    g.unlock().await.unwrap();
    for w in [a, b] {
        tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(*order.lock(), ["first", "second"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_waiter_at_the_head_is_passed_over_after_its_deadline() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let g = c.fair_lock("fl:crash").lock().await.unwrap();
    // A waiter that died in line, 400 ms before its deadline.
    let ghost = "00000000-0000-4000-8000-000000000000:9";
    let now_ms: i64 = {
        let t: Vec<String> = s.cmd(&["TIME"]);
        t[0].parse::<i64>().unwrap() * 1000 + t[1].parse::<i64>().unwrap() / 1000
    };
    let _: () = s.cmd(&["RPUSH", &queue_key("fl:crash"), ghost]);
    let _: () = s.cmd(&[
        "ZADD",
        &timeout_key("fl:crash"),
        &(now_ms + 400).to_string(),
        ghost,
    ]);
    let other = Client::connect(s.url()).await.unwrap();
    let waiter = tokio::spawn(async move {
        let g = other.fair_lock("fl:crash").lock().await.unwrap();
        g.unlock().await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    g.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the live waiter stayed behind a dead one")
        .unwrap();
    assert!(queue(&s, "fl:crash").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_peer_and_this_crate_queue_behind_and_wake_each_other() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let fair_peer = FairPeer::new(&s.url(), "fl:peer", 1, Duration::from_secs(300));
    let peer = fair_peer.field.as_str();
    // The peer holds; our waiter queues, and the peer's unlock wakes it on its channel.
    assert_eq!(fair_peer.try_acquire(), None);
    let ours = tokio::spawn({
        let l = c.fair_lock("fl:peer");
        async move {
            let g = l.lock().await.unwrap();
            let at = Instant::now();
            tokio::time::sleep(Duration::from_millis(300)).await;
            g.unlock().await.unwrap();
            at
        }
    });
    assert!(common::eventually(Duration::from_secs(5), || queue(&s, "fl:peer").len() == 1).await);
    // The peer comes back to wait behind ours.
    let released = Instant::now();
    assert_eq!(fair_peer.unlock(), Some(1));
    let got_at = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if s.cmd::<i64>(&["EXISTS", "fl:peer"]) == 1 {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("our waiter did not take the lock");
    assert!(
        got_at.duration_since(released) < Duration::from_millis(500),
        "woken by its bound, not by the peer's message"
    );
    assert!(fair_peer.try_acquire().is_some(), "the peer barged in");
    assert_eq!(queue(&s, "fl:peer"), [peer], "the peer waits in line");
    // Our unlock notifies the peer on its own channel, and the peer then takes it.
    let mut sub = s.conn();
    let mut pubsub = sub.as_pubsub();
    pubsub
        .subscribe(format!(
            "{}:{peer}",
            redis_rlock::protocol::channel_name("fl:peer")
        ))
        .unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let msg = tokio::task::block_in_place(|| pubsub.get_message()).expect("the peer was not told");
    assert_eq!(msg.get_payload::<String>().unwrap(), "0");
    ours.await.unwrap();
    assert_eq!(fair_peer.try_acquire(), None, "the peer's turn");
    assert_eq!(fair_peer.unlock(), Some(1));
    assert!(queue(&s, "fl:peer").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_re_enters_is_renewed_and_excludes_the_plain_lock_of_its_name() {
    let s = RedisServer::start();
    let c = common::client_with(
        &s.url(),
        Duration::from_millis(900),
        Duration::from_millis(500),
    )
    .await;
    let other = Client::connect(s.url()).await.unwrap();
    let lock = c.fair_lock("fl:basic");
    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    assert!(other.lock("fl:basic").try_lock().await.unwrap().is_none());
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(!outer.is_lost(), "not renewed");
    assert_eq!(s.cmd::<i64>(&["EXISTS", "fl:basic"]), 1);
    inner.unlock().await.unwrap();
    outer.unlock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "fl:basic"]), 0);
    // force_unlock deletes and tells the first waiter.
    let g = other.fair_lock("fl:basic").lock().await.unwrap();
    let waiter = tokio::spawn({
        let l = c.fair_lock("fl:basic");
        async move { l.lock().await.unwrap().unlock().await.unwrap() }
    });
    assert!(common::eventually(Duration::from_secs(5), || queue(&s, "fl:basic").len() == 1).await);
    assert!(c.fair_lock("fl:basic").force_unlock().await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("force unlock did not wake the first waiter")
        .unwrap();
    drop(g);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crashed_holders_lease_ends_the_queue_is_served_in_order() {
    let s = RedisServer::start();
    // A holder that died: its hold ends with its lease, and nothing is published.
    let _: () = s.cmd(&[
        "HSET",
        "fl:dead",
        "00000000-0000-4000-8000-000000000000:1",
        "1",
    ]);
    let _: () = s.cmd(&["PEXPIRE", "fl:dead", "800"]);
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let c = Client::connect(s.url()).await.unwrap();
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let g = c.fair_lock("fl:dead").lock().await.unwrap();
            order.lock().push((i, Instant::now()));
            g.unlock().await.unwrap();
        }));
        let s = &s;
        assert!(
            common::eventually(Duration::from_secs(5), || queue(s, "fl:dead").len()
                == i + 1)
            .await
        );
    }
    let started = Instant::now();
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .expect("the queue was not served after the lease ended")
            .unwrap();
    }
    let order = order.lock().clone();
    assert_eq!(order.iter().map(|o| o.0).collect::<Vec<_>>(), [0, 1, 2]);
    // The first asks again within 5/3 s (a third of the recheck period) after the lease ends.
    assert!(order[0].1.duration_since(started) < Duration::from_secs(3));
}
