//! Contention with churn: clients of one or several tasks, waits short enough to give up
//! often, holds of 0 to 1 ms. Never two holders, and nothing left behind: no hold of a
//! waiter that was gone, and no key of the lock once it is over. Also: an ACL without
//! `TIME` or `PUBSUB`, and a cut-off re-entry.

mod common;

use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::Client;

async fn client(s: &RedisServer) -> Client {
    Client::builder(s.url()).build().await.unwrap()
}

/// A churn (see `common::churn_tasks`) of `clients` clients of `per` tasks each on
/// `name`: never two holders, and once the background give-backs are in (a moment, far
/// below a lease) nothing holds the lock. Returns (grants, waits given up).
async fn churn_leaves_nothing(s: &RedisServer, clients: usize, per: u64, name: &str) -> (u64, u64) {
    common::init_tracing();
    let mut owned = Vec::new();
    for _ in 0..clients {
        owned.push(client(s).await);
    }
    let clients: Vec<&Client> = owned.iter().collect();
    let (acquired, gave_up) =
        common::churn_tasks(&clients, per, name, Duration::from_secs(3)).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let exists: i64 = s.cmd(&["EXISTS", name]);
        if exists == 0 {
            break;
        }
        let holders: Vec<String> = s.cmd(&["HGETALL", name]);
        assert!(Instant::now() < deadline, "left: holds {holders:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (acquired, gave_up)
}

/// Clients of two tasks each, some waits short enough to give up often, holds of 0 to
/// 1 ms: never two holders, and when it is over nothing holds the lock (no grant left to
/// a waiter that was gone).
#[tokio::test(flavor = "multi_thread")]
async fn churn_keeps_exclusion_and_leaves_no_orphan_hold() {
    let s = RedisServer::start();
    let (acquired, gave_up) = churn_leaves_nothing(&s, 6, 2, "churn:churn").await;
    println!("FIGURE churn: {acquired} acquired, {gave_up} gave up");
    assert!(acquired > 100);
    assert!(gave_up > 0, "no waiter gave up");
}

/// Clients of six tasks each, waits short enough to give up often: runs of hand-overs
/// inside each client, which give way to other clients, while waiters give up, some with
/// an offer of their own client in flight (an offer that a release of a hold given back
/// in the background makes, too). Never two holders, and at the end nothing holds the
/// lock.
#[tokio::test(flavor = "multi_thread")]
async fn waiters_giving_up_around_a_hand_over_that_gave_way_leave_no_orphan_hold() {
    let s = RedisServer::start();
    let (acquired, gave_up) = churn_leaves_nothing(&s, 3, 6, "churn:churn6").await;
    println!("FIGURE churn of 3 x 6 tasks: {acquired} acquired, {gave_up} gave up");
    assert!(acquired > 100);
    assert!(gave_up > 0, "no waiter gave up");
}

/// An ACL without `TIME` and `PUBSUB` (what `docs/protocol.md` once asked for) costs
/// nothing: releases are published and heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_without_time_and_pubsub_gets_published_releases() {
    let s = RedisServer::start();
    let mut setuser = vec![
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">pw",
        "~app:*",
        "~redisson_*:{app:*",
        "resetchannels",
        "&redisson_lock__channel:*",
    ];
    let commands = "+evalsha +eval +subscribe +unsubscribe +exists +hget +pttl +ping \
        +hexists +hincrby +hset +hdel +pexpire +del +publish +get +set +incr +type +lpos \
        +rpush +lindex +lpop +lrem";
    setuser.extend(commands.split_whitespace());
    let _: () = s.cmd(&setuser);
    let url = format!("redis://locker:pw@127.0.0.1:{}", s.port);
    let (a, b) = (
        Client::connect(&url).await.unwrap(),
        Client::connect(&url).await.unwrap(),
    );
    let name = "app:dg-acl";
    for round in 0..3 {
        let held = a.lock(name).lock().await.unwrap();
        let waiter = tokio::spawn({
            let l = b.lock(name);
            async move { l.lock().await.unwrap().unlock().await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.unlock().await.unwrap();
        tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the waiter slept through the unlock"))
            .unwrap();
    }
}

/// A task that holds a fixed-lease lock and asks for it again (a re-entry, sent to
/// Redis): a call cut off at any point leaves the first hold in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_reentry_leaves_the_first_hold() {
    let s = RedisServer::start();
    let a = client(&s).await;
    let name = "churn:reenter";
    let lock = a.lock(name);
    let first = lock.lock_with_lease(Duration::from_secs(30)).await.unwrap();
    for i in 0..60u64 {
        let cut = Duration::from_micros(50 * (i % 12));
        let again = tokio::time::timeout(cut, lock.lock_with_lease(Duration::from_secs(30))).await;
        if let Ok(g) = again {
            g.unwrap().unlock().await.unwrap();
        }
    }
    // Background give-backs settle within a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let count: Option<i64> = s.cmd(&["HGET", name, first.holder_field()]);
    assert_eq!(count, Some(1), "the first hold is intact");
    first.unlock().await.unwrap();
}
