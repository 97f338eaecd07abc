//! The semaphore and the permit-expirable semaphore on a real server: a Redisson peer
//! (Redisson's scripts for each operation, typed in by hand from the facts and run with
//! `redis::Script`) shares them with this crate in both directions; waits keep their
//! bounds; a dropped wait leaves nothing taken; a crashed holder's permit comes back
//! when its lease ends; bad input gets typed errors.

mod common;

use std::time::{Duration, Instant};

use common::redisson_permits::{redisson_permit_acquire, redisson_permit_release, unhex};
use common::{client_with, eventually, RedisServer};
use redis_rlock::{protocol, Error};

const LONG: Duration = Duration::from_secs(30);

/// Redisson's `RSemaphore.tryAcquire(permits)`: all or nothing.
fn redisson_try_acquire(conn: &mut redis::Connection, name: &str, permits: u32) -> bool {
    let script = redis::Script::new(
        r"
        local have = redis.call('get', KEYS[1])
        if have ~= false and tonumber(have) >= tonumber(ARGV[1]) then
            redis.call('decrby', KEYS[1], ARGV[1])
            return 1
        end
        return 0",
    );
    let n: i64 = script.key(name).arg(permits).invoke(conn).unwrap();
    n == 1
}

/// Redisson's `RSemaphore.release(permits)`: INCRBY, then publish the new count.
fn redisson_release(conn: &mut redis::Connection, name: &str, permits: u32) {
    let script = redis::Script::new(
        r"
        local now = redis.call('incrby', KEYS[1], ARGV[1])
        redis.call(ARGV[2], KEYS[2], now)",
    );
    let _: () = script
        .key(name)
        .key(protocol::semaphore_channel(name))
        .arg(permits)
        .arg("publish")
        .invoke(conn)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_release_wakes_our_waiter_and_ours_wakes_a_redisson_subscriber() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
    let sem = c.semaphore("sem:interop");
    assert!(sem.try_set_permits(0).await.unwrap());
    assert!(!sem.try_set_permits(5).await.unwrap(), "set twice");
    let mut peer = s.conn();

    // Ours waits; the peer's release (INCRBY + PUBLISH) wakes it. The recheck period is
    // 30 s, so only the message explains a quick return.
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            (
                sem.try_acquire_for(2, Duration::from_secs(10)).await,
                t.elapsed(),
            )
        })
    };
    let channel = protocol::semaphore_channel("sem:interop");
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 1).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    redisson_release(&mut peer, "sem:interop", 2);
    let (got, took) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(got.unwrap(), "our waiter did not get the peer's permits");
    assert!(took < Duration::from_secs(3), "woken late: {took:?}");
    assert_eq!(sem.available_permits().await.unwrap(), 0);

    // A subscriber like Redisson's hears our release, with the new count, and the peer
    // takes what we gave.
    let mut sub = redis::Client::open(s.url())
        .unwrap()
        .get_connection()
        .unwrap();
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut ps = sub.as_pubsub();
    ps.subscribe(&channel).unwrap();
    sem.release(2).await.unwrap();
    let msg = ps.get_message().unwrap();
    assert_eq!(msg.get_payload::<String>().unwrap(), "2");
    assert!(redisson_try_acquire(&mut peer, "sem:interop", 2));
    assert!(!redisson_try_acquire(&mut peer, "sem:interop", 1));
    assert!(!sem.try_acquire(1).await.unwrap());
    // Drain and add, as Redisson's.
    sem.add_permits(3).await.unwrap();
    assert_eq!(sem.drain_permits().await.unwrap(), 3);
    assert_eq!(s.cmd::<String>(&["GET", "sem:interop"]), "0");
    sem.add_permits(-2).await.unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), -2);
    drop(ps);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_of_several_permits_serves_every_waiter_it_can() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
    let sem = c.semaphore("sem:many");
    sem.try_set_permits(0).await.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let sem = sem.clone();
            tokio::spawn(async move { sem.try_acquire_for(1, Duration::from_secs(10)).await })
        })
        .collect();
    let channel = protocol::semaphore_channel("sem:many");
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 1).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    sem.release(3).await.unwrap();
    for w in waiters {
        let got = tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .unwrap()
            .unwrap();
        assert!(got.unwrap());
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_wait_returns_in_time_and_a_dropped_one_leaves_nothing() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
    let sem = c.semaphore("sem:bounds");
    sem.try_set_permits(1).await.unwrap();
    assert!(sem.try_acquire(1).await.unwrap());

    // Nothing free: false at the deadline, not before and not much after.
    let t = Instant::now();
    assert!(!sem
        .try_acquire_for(1, Duration::from_millis(300))
        .await
        .unwrap());
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(600),
        "{took:?}"
    );

    // A waiting acquire dropped: no subscription stays, and the permit released later
    // is still there.
    let channel = protocol::semaphore_channel("sem:bounds");
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire(1).await })
    };
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 1).await);
    waiter.abort();
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 0).await);
    sem.release(1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sem.available_permits().await.unwrap(), 1);

    // Redis stalls writes past the deadline with the acquire in flight: the call returns
    // at its deadline, and the permit the late script takes is given back.
    let _: () = s.cmd(&["CLIENT", "PAUSE", "700", "WRITE"]);
    let t = Instant::now();
    let r = sem.try_acquire_for(1, Duration::from_millis(200)).await;
    let took = t.elapsed();
    assert!(took < Duration::from_millis(450), "returned after {took:?}");
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        eventually(Duration::from_secs(5), || s
            .cmd::<String>(&["GET", "sem:bounds"])
            == "1")
        .await,
        "a permit taken after the caller left was not given back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors_and_writes_nothing() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
    let sem = c.semaphore("sem:errors");
    assert!(matches!(
        sem.acquire(0).await,
        Err(Error::InvalidCount {
            what: "permits",
            ..
        })
    ));
    assert!(matches!(
        sem.try_acquire(0).await,
        Err(Error::InvalidCount { .. })
    ));
    assert!(matches!(
        sem.release(0).await,
        Err(Error::InvalidCount { .. })
    ));
    // A release into a semaphore that does not exist creates nothing.
    assert!(matches!(
        sem.release(2).await,
        Err(Error::NoSuchSemaphore { .. })
    ));
    assert_eq!(s.cmd::<i64>(&["EXISTS", "sem:errors"]), 0);
    assert!(matches!(
        c.semaphore("").try_acquire(1).await,
        Err(Error::EmptyName)
    ));
    let _: () = s.cmd(&["HSET", "sem:hash", "f", "1"]);
    assert!(matches!(
        c.semaphore("sem:hash").try_acquire(1).await,
        Err(Error::WrongType { .. })
    ));
    let _: () = s.cmd(&["SET", "sem:text", "abc"]);
    assert!(matches!(
        c.semaphore("sem:text").try_acquire(1).await,
        Err(Error::WrongType { .. })
    ));
    assert_eq!(s.cmd::<String>(&["GET", "sem:text"]), "abc");

    // A sum outside the 64-bit range is refused, and the count stays as it was.
    let big = c.semaphore("sem:big");
    big.add_permits(i64::MAX - 1).await.unwrap();
    assert!(matches!(
        big.add_permits(i64::MAX).await,
        Err(Error::InvalidCount {
            what: "permits",
            ..
        })
    ));
    assert!(matches!(
        big.release(2).await,
        Err(Error::InvalidCount { .. })
    ));
    assert_eq!(big.available_permits().await.unwrap(), i64::MAX - 1);
    big.release(1).await.unwrap();
    assert_eq!(big.available_permits().await.unwrap(), i64::MAX);
    assert_eq!(s.cmd::<String>(&["GET", "sem:big"]), i64::MAX.to_string());
    big.add_permits(i64::MIN + 1).await.unwrap();
    big.add_permits(-1).await.unwrap();
    assert_eq!(big.available_permits().await.unwrap(), -1);
    assert!(matches!(
        big.add_permits(i64::MIN).await,
        Err(Error::InvalidCount { .. })
    ));
    assert_eq!(big.available_permits().await.unwrap(), -1);

    let pes = c.permit_expirable_semaphore("pes:errors");
    assert!(matches!(
        pes.acquire(Duration::ZERO).await,
        Err(Error::InvalidLease { .. })
    ));
    for bad in ["xyz", "abcd", "00112233445566778899aabbccddeeff00"] {
        assert!(
            matches!(
                pes.try_release(bad).await,
                Err(Error::InvalidPermitId { .. })
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        pes.release("00112233445566778899aabbccddeeff").await,
        Err(Error::PermitNotHeld { .. })
    ));
    assert_eq!(s.cmd::<i64>(&["EXISTS", "pes:errors"]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expirable_permits_interoperate_with_a_redisson_peer() {
    let s = RedisServer::start();
    let c = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
    let pes = c.permit_expirable_semaphore("pes:interop");
    assert!(pes.try_set_permits(2).await.unwrap());
    let mut peer = s.conn();

    let ours = pes.acquire(Duration::from_secs(20)).await.unwrap();
    assert_eq!(ours.id().len(), 32);
    let peer_id = [7u8; 16];
    assert_eq!(
        redisson_permit_acquire(&mut peer, "pes:interop", &peer_id, 20_000).as_deref(),
        Some("OK")
    );
    assert_eq!(pes.available_permits().await.unwrap(), 0);
    // The peer sees our busy permit's expiry as its earliest.
    let busy = redisson_permit_acquire(&mut peer, "pes:interop", &[8u8; 16], 1000).unwrap();
    assert!(busy.starts_with(':'), "{busy}");
    // Each releases the other's permit by id.
    assert_eq!(
        redisson_permit_release(&mut peer, "pes:interop", &unhex(ours.id())),
        1
    );
    let peer_hex: String = peer_id.iter().map(|b| format!("{b:02x}")).collect();
    assert!(pes.try_release(&peer_hex).await.unwrap());
    assert!(!pes.try_release(&peer_hex).await.unwrap(), "released twice");
    assert_eq!(pes.available_permits().await.unwrap(), 2);

    // Our waiter wakes on the peer's release, before any lease would end.
    let a = pes.acquire(Duration::from_secs(20)).await.unwrap();
    assert_eq!(
        redisson_permit_acquire(&mut peer, "pes:interop", &peer_id, 20_000).as_deref(),
        Some("OK")
    );
    let waiter = {
        let pes = pes.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            (
                pes.try_acquire(Duration::from_secs(5), Duration::from_secs(10))
                    .await,
                t.elapsed(),
            )
        })
    };
    let channel = protocol::semaphore_channel("pes:interop");
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 1).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        redisson_permit_release(&mut peer, "pes:interop", &peer_id),
        1
    );
    let (got, took) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    let b = got.unwrap().expect("woken waiter got no permit");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(pes
        .update_lease_time(b.id(), Duration::from_secs(30))
        .await
        .unwrap());
    pes.release(a.id()).await.unwrap();
    pes.release(b.id()).await.unwrap();
    assert!(matches!(
        pes.release(b.id()).await,
        Err(Error::PermitNotHeld { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permit_comes_back_when_its_lease_ends() {
    let s = RedisServer::start();
    let pes_name = "pes:crash";
    {
        // The holder takes the only permit for 600 ms and vanishes without a release.
        let holder = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
        let p = holder.permit_expirable_semaphore(pes_name);
        p.try_set_permits(1).await.unwrap();
        p.acquire(Duration::from_millis(600)).await.unwrap();
    }
    let c = client_with(&s.url(), LONG, Duration::from_secs(2)).await;
    let pes = c.permit_expirable_semaphore(pes_name);
    // Nothing is published when a lease ends: the waiter sleeps until the earliest end
    // (the 30 s recheck period could not explain a return near 600 ms).
    let t = Instant::now();
    let got = pes
        .try_acquire(Duration::from_secs(5), Duration::from_secs(5))
        .await
        .unwrap();
    let took = t.elapsed();
    assert!(got.is_some(), "the expired permit did not come back");
    assert!(took < Duration::from_millis(1500), "woke late: {took:?}");
    // A bounded wait that ends before the next lease end returns on time.
    let t = Instant::now();
    let none = pes
        .try_acquire(Duration::from_secs(5), Duration::from_millis(300))
        .await
        .unwrap();
    assert!(none.is_none());
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(600),
        "{took:?}"
    );
    // A dropped waiting acquire leaves no subscription and takes nothing.
    let channel = protocol::semaphore_channel(pes_name);
    let waiter = {
        let pes = pes.clone();
        tokio::spawn(async move { pes.acquire(Duration::from_secs(5)).await })
    };
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 1).await);
    waiter.abort();
    assert!(eventually(Duration::from_secs(5), || s.numsub(&channel) == 0).await);
    pes.release(got.unwrap().id()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(pes.available_permits().await.unwrap(), 1);
    assert_eq!(
        s.cmd::<i64>(&["ZCARD", &protocol::permit_timeout_key(pes_name)]),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_reply_was_lost_takes_its_permits_once() {
    let s = RedisServer::start();
    let proxy = std::sync::Arc::new(common::proxy::Proxy::start(s.port).await);
    let c = redis_rlock::Client::builder(proxy.url())
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let sem = c.semaphore("sem:lost");
    assert!(sem.try_set_permits(5).await.unwrap());
    // 250 ms each way: the script runs but its reply misses the 300 ms timeout; the
    // delay is gone before the retry is sent.
    let lift = proxy.delay_for(Duration::from_millis(250), Duration::from_millis(280));
    assert!(
        sem.try_acquire_for(2, Duration::from_secs(5))
            .await
            .expect("the retry must report the take"),
        "the permits the first send took were not reported"
    );
    lift.await.unwrap();
    assert_eq!(
        sem.available_permits().await.unwrap(),
        3,
        "taken twice, or leaked"
    );
}
