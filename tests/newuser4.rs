//! A new user's programs (round 4) at the ends of a wait, as a user meets them: the README's
//! quick start run for real, a `try_lock_for` that runs out, a `lock()` dropped by a
//! timeout while the lock is being handed to it, `Client::shutdown` while tasks wait, and
//! fair and write waiters that give up, and a run of hand-overs after a quiet spell (a
//! task that asks again after its cut `lock()`: `tests/newuser4_again.rs`). Each against
//! a real redis-server; after each, Redis keeps nothing of the caller. Run:
//! `cargo test --test newuser4 -- --nocapture`

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{eventually, newcomer, RedisServer};
use redis_rlock::{protocol, Client, Error, OwnerId};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_does_what_its_comments_say() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("orders:42");

    let outer = lock.lock().await.unwrap();
    assert!(outer.is_watchdog(), "lock(): the watchdog keeps the lease");
    let inner = lock.lock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 2, "same task re-enters");
    inner.unlock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 1);
    assert!(
        lock.is_locked().await.unwrap(),
        "hold count 1, still locked"
    );
    outer.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap(), "released");

    let g = lock
        .try_lock_for(ms(500), Some(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("a free lock is taken");
    assert!(!g.is_watchdog(), "a fixed lease, no watchdog");
    let ttl = lock.remaining_ttl().await.unwrap().expect("a lease");
    assert!(
        ttl <= Duration::from_secs(10) && ttl > Duration::from_secs(9),
        "held for at most 10 s: {ttl:?}"
    );
    g.unlock().await.unwrap();

    let n = lock.run(|| async { 1 + 1 }).await.unwrap();
    assert_eq!(n, 2);
    assert!(
        !lock.is_locked().await.unwrap(),
        "run releases when the work ends"
    );

    // Joined in one task, each in its own scope: they exclude each other, so one of
    // them waits for the other's release and both finish.
    let (a, b) = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::join!(
            OwnerId::scope(lock.run(|| async {
                tokio::time::sleep(ms(50)).await;
                n
            })),
            OwnerId::scope(lock.run(|| async { n })),
        )
    })
    .await
    .expect("two scopes of one task take turns");
    assert_eq!((a.unwrap(), b.unwrap()), (2, 2));

    let fenced = client.fenced_lock("accounts:7");
    newcomer::tokens_grow(&fenced).await;

    client.shutdown().await.unwrap();
    newcomer::nothing_left(
        &s,
        client.id(),
        Duration::from_secs(2),
        "after the quick start",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_lock_for_that_runs_out_returns_none_in_time_and_leaves_nothing() {
    let s = RedisServer::start();
    let (holder, other) = newcomer::connect_two(&s).await;
    let user = Client::connect(s.url()).await.unwrap();
    let name = "nu4:busy";
    let held = holder.lock(name).lock().await.unwrap();
    // Another client waits too: the user's call meets a line as well as a holder.
    let waiter = newcomer::timed_waiter(other.lock(name));
    tokio::time::sleep(ms(200)).await;

    for round in 0..3 {
        let wait = ms(300);
        let t = Instant::now();
        let got = user.lock(name).try_lock_for(wait, None).await;
        let took = t.elapsed();
        assert!(
            matches!(got, Ok(None)),
            "round {round}: held by another client, the call answers Ok(None): {got:?}"
        );
        assert!(
            took >= wait && took < wait + ms(200),
            "round {round}: returned after {took:?} for a {wait:?} wait"
        );
        newcomer::nothing_left(&s, user.id(), ms(500), "a try_lock_for that ran out").await;
        assert_eq!(
            s.cmd::<Vec<String>>(&["HKEYS", name]),
            vec![held.holder_field().to_string()],
            "round {round}: the holder still holds, alone"
        );
    }

    held.unlock().await.unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the other client's waiter is served once the holder leaves")
        .unwrap();
    println!("the other client's waiter waited {waited:?}");
    assert!(newcomer::gone_soon(&s, name).await, "the lock ends free");
    newcomer::shut_down(&[&holder, &other, &user]).await;
    newcomer::nothing_left(&s, user.id(), Duration::from_secs(2), "at the end").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_dropped_by_a_timeout_while_handed_the_lock_leaves_it_free() {
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    // One client behind the proxy: its holder's unlock hands the lock to its own waiter,
    // and the proxy's latency keeps that hand-over on its way while the waiter is cut.
    let near = Client::connect(proxy.url()).await.unwrap();
    let next = Client::connect(s.url()).await.unwrap();
    let name = "nu4:handed";
    let latency = ms(150);

    for round in 0..3 {
        proxy.set_latency(Duration::ZERO);
        let held = near.lock(name).lock().await.unwrap();
        let holder = held.holder_field().to_string();
        let unlock_at = Instant::now() + ms(800);
        // The waiter's `lock()` is cut 60 ms into the unlock's round trip (300 ms with
        // the latency): after the unlock chose it, before the grant came back.
        let cut_at = unlock_at + ms(60);
        let lock = near.lock(name);
        let cut = tokio::spawn(async move { tokio::time::timeout_at(cut_at, lock.lock()).await });
        // Asleep in its client's hand-over queue by then: busy, subscribed, busy again.
        tokio::time::sleep_until(unlock_at - ms(100)).await;
        proxy.set_latency(latency);
        tokio::time::sleep_until(unlock_at).await;
        held.unlock().await.unwrap();
        // The grant reached the client after its waiter was gone; its release goes back
        // through the proxy, so the hash shows whom the unlock handed the lock to.
        let fields: Vec<String> = s.cmd(&["HKEYS", name]);
        let dropped = cut.await.unwrap();
        assert!(
            dropped.is_err(),
            "round {round}: the waiter was cut before the hand-over reached it: {:?}",
            dropped.map(|r| r.map(|g| g.holder_field().to_string()))
        );
        assert!(
            fields.len() == 1 && fields[0] != holder,
            "round {round}: expected the unlock to hand the lock to the sleeping waiter it \
             chose; holder {holder}, hash right after the unlock {fields:?}"
        );
        let t = Instant::now();
        let got = next
            .lock(name)
            .try_lock_for(Duration::from_secs(1), None)
            .await
            .unwrap();
        let took = t.elapsed();
        let state: Vec<String> = s.cmd(&["HKEYS", name]);
        let g = got.unwrap_or_else(|| {
            panic!(
                "round {round}: the hand-over to a dropped waiter was left held by nobody: \
                 {state:?}, PTTL {}",
                s.cmd::<i64>(&["PTTL", name])
            )
        });
        println!("round {round}: the next client got the lock {took:?} after asking");
        g.unlock().await.unwrap();
    }
    proxy.set_latency(Duration::ZERO);
    newcomer::shut_down(&[&near, &next]).await;
    newcomer::nothing_left(&s, near.id(), Duration::from_secs(2), "at the end").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_tasks_wait_turns_them_away_with_closed_and_leaves_nothing() {
    let s = RedisServer::start();
    let (holder, user) = newcomer::connect_two(&s).await;
    let (plain, fair, rw) = ("nu4:sd", "nu4:sd-fair", "nu4:sd-rw");
    let _p = holder.lock(plain).lock().await.unwrap();
    let _f = holder.fair_lock(fair).lock().await.unwrap();
    let _w = holder.read_write_lock(rw).write().lock().await.unwrap();
    // The user holds a lock of its own too, guard alive at shutdown.
    let own = user.lock("nu4:sd-own").lock().await.unwrap();

    let mut tasks = Vec::new();
    for _ in 0..3 {
        let l = user.lock(plain);
        tasks.push((
            "plain lock()",
            tokio::spawn(async move { l.lock().await.map(drop) }),
        ));
    }
    let l = user.lock(plain);
    tasks.push((
        "plain try_lock_for(60 s)",
        tokio::spawn(async move {
            l.try_lock_for(Duration::from_secs(60), None)
                .await
                .map(drop)
        }),
    ));
    let l = user.fair_lock(fair);
    tasks.push((
        "fair lock()",
        tokio::spawn(async move { l.lock().await.map(drop) }),
    ));
    let l = user.read_write_lock(rw).read();
    tasks.push((
        "read lock()",
        tokio::spawn(async move { l.lock().await.map(drop) }),
    ));
    let l = user.read_write_lock(rw).write();
    tasks.push((
        "write lock()",
        tokio::spawn(async move { l.lock().await.map(drop) }),
    ));
    tokio::time::sleep(ms(500)).await;
    for (what, t) in &tasks {
        assert!(!t.is_finished(), "{what} waits while the holder holds");
    }

    let t = Instant::now();
    user.shutdown().await.unwrap();
    for (what, task) in tasks {
        let out = tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .unwrap_or_else(|_| panic!("{what} still waits 2 s after shutdown"))
            .unwrap();
        assert!(
            matches!(out, Err(Error::Closed)),
            "{what} ends with Error::Closed: {out:?}"
        );
    }
    println!("shutdown and every waiter's end took {:?}", t.elapsed());
    assert!(own.is_lost(), "a guard alive at shutdown is released");
    drop(own);
    newcomer::nothing_left(&s, user.id(), Duration::from_secs(2), "after shutdown").await;
    // The holder's locks are untouched, and its own next calls are not held up.
    assert_eq!(s.cmd::<i64>(&["EXISTS", plain, fair, rw]), 3);
    newcomer::shut_down(&[&holder]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_fair_and_write_waiters_do_not_hold_up_the_next_one() {
    let s = RedisServer::start();
    let (holder, a) = newcomer::connect_two(&s).await;
    let b = Client::connect(s.url()).await.unwrap();

    // Fair: the first in the queue gives up; the one behind it is next at the release.
    let fair = "nu4:fair";
    let held = holder.fair_lock(fair).lock().await.unwrap();
    let l = a.fair_lock(fair);
    let first = tokio::spawn(async move { tokio::time::timeout(ms(600), l.lock()).await });
    tokio::time::sleep(ms(200)).await;
    let l = b.fair_lock(fair);
    let behind = tokio::spawn(async move {
        let g = l.lock().await.unwrap();
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    });
    assert!(
        first.await.unwrap().is_err(),
        "the first fair waiter is cut"
    );
    // A cancelled waiter leaves its place in the background (its `Drop` cannot wait).
    let queue = || -> Vec<String> { s.cmd(&["LRANGE", &protocol::queue_key(fair), "0", "-1"]) };
    let left = eventually(ms(500), || !queue().iter().any(|f| f.starts_with(a.id()))).await;
    assert!(left, "the cut fair waiter left the queue: {:?}", queue());
    let released = Instant::now();
    held.unlock().await.unwrap();
    let served = tokio::time::timeout(Duration::from_secs(5), behind)
        .await
        .expect("the fair waiter behind a cut one is served")
        .unwrap();
    let after = served.saturating_duration_since(released);
    println!("fair: served {after:?} after the release");
    assert!(
        after < ms(500),
        "fair: the next waiter is served promptly, not after {after:?}"
    );

    // Write: a writer that gives up does not keep new readers out, nor the next writer.
    let rw = "nu4:rw";
    let read = holder.read_write_lock(rw).read().lock().await.unwrap();
    let l = a.read_write_lock(rw).write();
    let writer = tokio::spawn(async move { tokio::time::timeout(ms(400), l.lock()).await });
    assert!(writer.await.unwrap().is_err(), "the writer is cut");
    let t = Instant::now();
    let r = b
        .read_write_lock(rw)
        .read()
        .try_lock_for(Duration::from_secs(2), None)
        .await
        .unwrap()
        .expect("a reader joins the holder's read lock");
    let joined = t.elapsed();
    println!("rw: a reader joined {joined:?} after the writer was cut");
    assert!(
        joined < ms(200),
        "rw: a cut writer held a new reader back {joined:?}"
    );
    r.unlock().await.unwrap();
    let l = b.read_write_lock(rw).write();
    let next = tokio::spawn(async move {
        let g = l.lock().await.unwrap();
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    });
    tokio::time::sleep(ms(200)).await;
    let released = Instant::now();
    read.unlock().await.unwrap();
    let served = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("the next writer is served")
        .unwrap();
    let after = served.saturating_duration_since(released);
    println!("rw: the next writer was served {after:?} after the release");
    assert!(
        after < ms(500),
        "rw: the next writer is served promptly, not after {after:?}"
    );

    newcomer::shut_down(&[&holder, &a, &b]).await;
    for c in [&a, &b] {
        newcomer::nothing_left(&s, c.id(), Duration::from_secs(2), "at the end").await;
    }
}

/// One round of `client`'s hand-over on `name`: a task holds, another of the same client
/// waits until it sleeps, the holder releases. How many hand-overs the client counted
/// (1 when the release went straight to the sleeping waiter), and how long the waiter
/// waited after the release.
async fn hand_over_round(client: &Client, name: &str) -> (u64, Duration) {
    let held = client.lock(name).lock().await.unwrap();
    let l = client.lock(name);
    let waiter = tokio::spawn(async move {
        let g = l.lock().await.unwrap();
        let at = Instant::now();
        // Released at once: with nobody else of the client waiting, published.
        g.unlock().await.unwrap();
        at
    });
    tokio::time::sleep(ms(300)).await;
    let before = client.stats().handovers;
    let released = Instant::now();
    held.unlock().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is served")
        .unwrap();
    (
        client.stats().handovers - before,
        got.saturating_duration_since(released),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_hand_overs_does_not_outlive_the_release_that_published_it() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let name = "nu4:runs";
    for round in 0..4 {
        let (handed, after) = hand_over_round(&client, name).await;
        println!(
            "round {round}: {handed} hand-over(s), the waiter served {after:?} after the release"
        );
        assert_eq!(
            handed, 1,
            "round {round}: the release went to the client's sleeping waiter (a run of one, \
             the last one published long ago); served {after:?} after the release"
        );
        tokio::time::sleep(ms(200)).await;
    }
    client.shutdown().await.unwrap();
    newcomer::nothing_left(&s, client.id(), Duration::from_secs(2), "at the end").await;
}
