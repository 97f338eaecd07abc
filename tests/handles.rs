//! Whole handles on a real server: `delete()` of the semaphores and the latch (what goes,
//! what waiters do, a new round over an earlier run's state), `WrongType` from every
//! synchronizer on a key of another type, the address in `Unavailable`, and `valkey://`
//! URLs.

mod common;

use std::time::{Duration, Instant};

use common::{client_with, eventually, RedisServer};
use redis_rlock::{protocol, Client, Error};

const LONG: Duration = Duration::from_secs(30);

async fn client(s: &RedisServer) -> Client {
    client_with(&s.url(), LONG, Duration::from_secs(2)).await
}

fn wrong_type<T: std::fmt::Debug>(r: redis_rlock::Result<T>, key: &str, what: &str) {
    match r {
        Err(Error::WrongType { key: k }) => assert_eq!(k, key, "{what}"),
        other => panic!("{what}: expected WrongType for `{key}`, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_delete_removes_the_count_and_waiters_keep_their_bounds() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let sem = c.semaphore("h:sem");
    assert!(sem.try_set_permits(1).await.unwrap());
    assert!(sem.try_acquire(1).await.unwrap());

    // A bounded waiter and an unbounded one, both asleep on an empty semaphore.
    let bounded = {
        let sem = sem.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            (
                sem.try_acquire_for(1, Duration::from_millis(1500)).await,
                t.elapsed(),
            )
        })
    };
    let unbounded = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire(1).await })
    };
    assert!(eventually(Duration::from_secs(5), || s.numsub(sem.channel()) >= 1).await);

    assert!(sem.delete().await.unwrap(), "the semaphore existed");
    assert_eq!(s.cmd::<i64>(&["EXISTS", "h:sem"]), 0);
    assert!(!sem.delete().await.unwrap(), "nothing left to delete");

    // The bounded waiter gives up at its deadline, not before and not much after.
    let (got, took) = bounded.await.unwrap();
    assert!(!got.unwrap(), "no permit on a deleted semaphore");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(4),
        "{took:?}"
    );
    // The permit taken before the delete is not owed back: nothing is recreated.
    assert!(matches!(
        sem.release(1).await,
        Err(Error::NoSuchSemaphore { .. })
    ));
    assert_eq!(s.cmd::<i64>(&["EXISTS", "h:sem"]), 0);

    // A new round: set again, and the unbounded waiter is woken by it.
    assert!(!unbounded.is_finished());
    assert!(sem.try_set_permits(2).await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), unbounded)
        .await
        .expect("the waiter took a permit of the new round")
        .unwrap()
        .unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 1);

    // Only a count is deleted.
    let _: () = s.cmd(&["HSET", "h:sem-hash", "f", "1"]);
    wrong_type(
        c.semaphore("h:sem-hash").delete().await,
        "h:sem-hash",
        "delete",
    );
    assert_eq!(s.cmd::<i64>(&["EXISTS", "h:sem-hash"]), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_semaphore_delete_removes_count_and_leases() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let sem = c.permit_expirable_semaphore("h:psem");
    assert!(sem.try_set_permits(1).await.unwrap());
    let permit = sem.acquire(LONG).await.unwrap();
    assert_eq!(s.cmd::<i64>(&["ZCARD", sem.timeout_key()]), 1);

    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let r = sem.try_acquire(LONG, Duration::from_millis(1500)).await;
            (r.map(|p| p.is_some()), t.elapsed())
        })
    };
    assert!(eventually(Duration::from_secs(5), || s.numsub(sem.channel()) >= 1).await);
    assert!(sem.delete().await.unwrap());
    assert_eq!(
        s.cmd::<i64>(&["EXISTS", "h:psem", sem.timeout_key()]),
        0,
        "count and lease set both gone"
    );
    assert!(!sem.delete().await.unwrap());
    let (got, took) = waiter.await.unwrap();
    assert!(!got.unwrap());
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(4),
        "{took:?}"
    );

    // The permit went with it.
    assert!(!sem.update_lease_time(permit.id(), LONG).await.unwrap());
    assert!(matches!(
        sem.release(permit.id()).await,
        Err(Error::PermitNotHeld { .. })
    ));
    assert_eq!(s.cmd::<i64>(&["EXISTS", "h:psem"]), 0);
    assert!(sem.try_set_permits(2).await.unwrap(), "a new round");
    assert_eq!(sem.available_permits().await.unwrap(), 2);

    // A lease set of another type is not deleted, nor the count next to it.
    let odd = c.permit_expirable_semaphore("h:psem-odd");
    let _: () = s.cmd(&["SET", "h:psem-odd", "3"]);
    let _: () = s.cmd(&["SET", odd.timeout_key(), "x"]);
    wrong_type(odd.delete().await, "h:psem-odd", "delete");
    assert_eq!(
        s.cmd::<i64>(&["EXISTS", "h:psem-odd", odd.timeout_key()]),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latch_delete_opens_it_and_a_new_round_starts_over_a_left_latch() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let latch = c.count_down_latch("h:latch");
    // An earlier run left the latch at 1.
    let _: () = s.cmd(&["SET", "h:latch", "1"]);
    assert!(!latch.try_set_count(10).await.unwrap(), "state was left");

    let waiter = {
        let l = latch.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            (l.wait_for(Duration::from_secs(20)).await, t.elapsed())
        })
    };
    let channel = protocol::latch_channel("h:latch");
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) >= 1).await);
    // Redisson's message for a delete is "1"; listen as a Redisson peer would.
    let mut sub = redis::Client::open(s.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(&channel).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();

    assert!(latch.delete().await.unwrap());
    let heard: String = pubsub.get_message().unwrap().get_payload().unwrap();
    assert_eq!(heard, protocol::LATCH_NEW_COUNT_MESSAGE);
    let (open, took) = waiter.await.unwrap();
    assert!(open.unwrap(), "a deleted latch counts 0");
    assert!(
        took < Duration::from_secs(5),
        "woken, not timed out: {took:?}"
    );
    assert!(!latch.delete().await.unwrap());

    assert!(latch.try_set_count(10).await.unwrap(), "the new round");
    assert_eq!(latch.count().await.unwrap(), 10);
    assert_eq!(latch.count_down().await.unwrap(), 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_synchronizer_answers_wrong_type_for_a_key_of_another_type() {
    let s = RedisServer::start();
    let c = client(&s).await;
    let _: () = s.cmd(&["SET", "h:text", "abc"]);
    let _: () = s.cmd(&["RPUSH", "h:list", "a"]);
    for key in ["h:text", "h:list"] {
        let latch = c.count_down_latch(key);
        wrong_type(latch.count_down().await, key, "latch count_down");
        wrong_type(latch.try_set_count(2).await, key, "latch try_set_count");
        wrong_type(latch.count().await, key, "latch count");
        wrong_type(
            latch.wait_for(Duration::from_millis(50)).await,
            key,
            "latch wait",
        );

        let sem = c.semaphore(key);
        wrong_type(
            sem.try_set_permits(2).await,
            key,
            "semaphore try_set_permits",
        );
        wrong_type(sem.try_acquire(1).await, key, "semaphore try_acquire");
        wrong_type(sem.release(1).await, key, "semaphore release");
        wrong_type(sem.add_permits(1).await, key, "semaphore add_permits");
        wrong_type(sem.drain_permits().await, key, "semaphore drain_permits");
        wrong_type(sem.available_permits().await, key, "semaphore available");

        let psem = c.permit_expirable_semaphore(key);
        wrong_type(
            psem.try_set_permits(2).await,
            key,
            "permits try_set_permits",
        );
        wrong_type(
            psem.try_acquire(LONG, Duration::ZERO).await,
            key,
            "permits try_acquire",
        );
        wrong_type(psem.available_permits().await, key, "permits available");

        let rw = c.read_write_lock(key);
        wrong_type(rw.read().try_lock().await, key, "read lock");
        wrong_type(rw.write().try_lock().await, key, "write lock");
        wrong_type(c.fair_lock(key).try_lock().await, key, "fair lock");
    }
    assert_eq!(
        s.cmd::<String>(&["GET", "h:text"]),
        "abc",
        "nothing written"
    );
    assert_eq!(s.cmd::<i64>(&["LLEN", "h:list"]), 1, "nothing written");

    // An ended lease is given back first, into the count: a count that is not one must
    // answer WrongType there too, before anything is written.
    let psem = c.permit_expirable_semaphore("h:text");
    let _: () = s.cmd(&["ZADD", psem.timeout_key(), "1", "ended"]);
    wrong_type(
        psem.try_acquire(LONG, Duration::ZERO).await,
        "h:text",
        "permits try_acquire with an ended lease",
    );
    wrong_type(
        psem.available_permits().await,
        "h:text",
        "permits available",
    );
    wrong_type(
        psem.update_lease_time("00112233445566778899aabbccddeeff", LONG)
            .await,
        "h:text",
        "permits update_lease_time",
    );
    wrong_type(
        psem.try_release("00112233445566778899aabbccddeeff").await,
        "h:text",
        "permits try_release",
    );
    assert_eq!(s.cmd::<i64>(&["ZCARD", psem.timeout_key()]), 1);
    assert_eq!(s.cmd::<String>(&["GET", "h:text"]), "abc");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_names_the_address() {
    let check = |r: redis_rlock::Result<Client>, addr: &str| match r {
        Err(e @ Error::Unavailable { .. }) => {
            let Error::Unavailable { addr: a, .. } = &e else {
                unreachable!()
            };
            assert!(a.contains(addr), "{a}");
            assert!(e.to_string().contains(addr), "{e}");
        }
        other => panic!("expected Unavailable naming {addr}, got {other:?}"),
    };
    check(Client::connect("redis://127.0.0.1:1").await, "127.0.0.1:1");
    #[cfg(feature = "sentinel")]
    check(
        Client::sentinel(&["redis://127.0.0.1:1"], "mymaster")
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await,
        "127.0.0.1:1",
    );
    #[cfg(feature = "cluster")]
    check(
        Client::cluster(&["redis://127.0.0.1:1"])
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await,
        "127.0.0.1:1",
    );

    // A connection that breaks later names the server too.
    let mut s = RedisServer::start();
    let port = s.url().rsplit(':').next().unwrap().to_string();
    let c = client_with(&s.url(), LONG, Duration::from_millis(500)).await;
    s.kill();
    // On a loaded machine the first call may time out before the connection is known
    // dead; a later one is refused (bounded: 10 tries).
    let mut seen = Vec::new();
    for _ in 0..10 {
        match c.semaphore("h:gone").try_acquire(1).await {
            Err(e @ Error::Unavailable { .. }) => {
                assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
                return;
            }
            other => seen.push(format!("{other:?}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("expected Unavailable, got {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_urls_work_as_redis_urls() {
    let s = RedisServer::start();
    let url = s.url().replace("redis://", "valkey://");
    let c = Client::connect(&url).await.unwrap();
    let guard = c.lock("h:valkey").lock().await.unwrap();
    assert_eq!(s.cmd::<i64>(&["EXISTS", "h:valkey"]), 1);
    guard.unlock().await.unwrap();
    let b = Client::builder(&url)
        .response_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    assert!(b
        .semaphore("h:valkey-sem")
        .try_set_permits(1)
        .await
        .unwrap());
    // Without TLS support a `valkeys://` URL is refused, saying which feature is missing.
    #[cfg(not(feature = "tls-rustls"))]
    match Client::connect(url.replace("valkey://", "valkeys://")).await {
        Err(Error::InvalidConfig(m)) => assert!(m.contains("tls-rustls"), "{m}"),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[cfg(all(feature = "sentinel", feature = "cluster"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_url_lists_for_sentinel_and_cluster() {
    let valkey = |urls: Vec<String>| -> Vec<String> {
        urls.iter()
            .map(|u| u.replace("redis://", "valkey://"))
            .collect()
    };
    let topo = common::topology::SentinelTopology::start();
    let c = Client::sentinel(&valkey(topo.sentinel_urls()), &topo.master_name)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let g = c.lock("h:valkey-sentinel").lock().await.unwrap();
    assert_eq!(topo.master.cmd::<i64>(&["EXISTS", "h:valkey-sentinel"]), 1);
    g.unlock().await.unwrap();
    drop(topo);

    let cluster = common::topology::ClusterTopology::start();
    let c = Client::cluster(&valkey(cluster.urls()))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let latch = c.count_down_latch("h:valkey-cluster");
    assert!(latch.try_set_count(1).await.unwrap());
    assert_eq!(latch.count_down().await.unwrap(), 0);
}

/// The blocking builder's `build()` blocks and gives a blocking client, which has
/// `stats()` and the handles' `delete()`.
#[cfg(feature = "blocking")]
#[test]
fn blocking_build_stats_and_delete() {
    let s = RedisServer::start();
    let c: redis_rlock::blocking::Client = redis_rlock::blocking::Client::builder(s.url())
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let before = c.stats();
    let g = c.lock("h:blocking").lock().unwrap();
    g.unlock().unwrap();
    let after = c.stats();
    assert_eq!(after.acquisitions, before.acquisitions + 1);
    assert_eq!(after.releases, before.releases + 1);

    let latch = c.count_down_latch("h:blocking-latch");
    assert!(latch.try_set_count(2).unwrap());
    assert!(latch.delete().unwrap());
    assert!(latch.try_set_count(3).unwrap());
    assert_eq!(latch.count().unwrap(), 3);
    let sem = c.semaphore("h:blocking-sem");
    assert!(sem.try_set_permits(1).unwrap());
    assert!(sem.delete().unwrap());
    assert_eq!(s.cmd::<i64>(&["EXISTS", "h:blocking-sem"]), 0);
    let psem = c.permit_expirable_semaphore("h:blocking-psem");
    assert!(psem.try_set_permits(1).unwrap());
    assert!(psem.delete().unwrap());
    assert!(!psem.delete().unwrap());

    // From any async builder (here a redis-rs client of the caller's).
    let existing = redis::Client::open(s.url()).unwrap();
    let from = redis_rlock::blocking::ClientBuilder::from(Client::from_redis_client(existing))
        .build()
        .unwrap();
    assert!(from.lock("h:blocking").try_lock().unwrap().is_some());
    c.shutdown().unwrap();
    from.shutdown().unwrap();
}

/// The blocking builder has every setting of the async one, the fair lock's wait timeout
/// included (a new user found it missing: the README asks to match the Java side's): a
/// value out of range is refused at build, as on the async builder.
#[cfg(feature = "blocking")]
#[test]
fn blocking_builder_takes_the_fair_lock_wait_timeout() {
    let s = RedisServer::start();
    let refused = redis_rlock::blocking::Client::builder(s.url())
        .fair_lock_wait_timeout(Duration::from_millis(5))
        .build();
    assert!(
        matches!(refused, Err(Error::InvalidConfig(_))),
        "{:?}",
        refused.map(|_| ())
    );
    let c = redis_rlock::blocking::Client::builder(s.url())
        .fair_lock_wait_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let g = c.fair_lock("h:blocking-fair").lock().unwrap();
    g.unlock().unwrap();
    c.shutdown().unwrap();
}
