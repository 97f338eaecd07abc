//! A first-time user's walk through the README: nested locks in one task, a fixed lease,
//! a watchdog guard told of its loss, a Redisson peer on the same name, and the `rlock`
//! ops tool, each on a real redis-server.

mod common;

#[cfg(feature = "cli")]
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::redisson_waiter::{acquire, unlock};
use common::RedisServer;
use redis_rlock::protocol::channel_name;
use redis_rlock::{Client, Error};

const REDISSON_FIELD: &str = "0b0c0d0e-1111-2222-3333-444455556666:1";

fn redisson_acquire(s: &RedisServer, name: &str, lease_ms: u64) -> Option<i64> {
    acquire(&mut s.conn(), name, lease_ms, REDISSON_FIELD)
}

fn redisson_unlock(s: &RedisServer, name: &str) -> Option<i64> {
    unlock(&mut s.conn(), name, "00ff", REDISSON_FIELD)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_locks_in_one_task_count_and_release_as_the_readme_says() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu:orders:42");

    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    // A Redisson peer reading the hash sees the holds that went through Redis only.
    let in_hash: i64 = s.cmd(&["HGET", "nu:orders:42", outer.holder_field()]);
    assert!(in_hash >= 1, "{in_hash}");
    inner.unlock().await.unwrap();
    assert!(lock.is_locked().await.unwrap(), "one hold left");
    assert_eq!(lock.hold_count().await.unwrap(), 1);

    // Another task is another owner.
    let other = lock.clone();
    let t = tokio::spawn(async move { other.try_lock().await.unwrap().is_some() });
    assert!(
        !t.await.unwrap(),
        "a spawned task must not re-enter its parent's hold"
    );

    outer.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    let exists: i64 = s.cmd(&["EXISTS", "nu:orders:42"]);
    assert_eq!(exists, 0);
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_for_with_a_lease_waits_its_bound_and_the_lease_ends_the_hold() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu:lease");
    let held = lock.lock().await.unwrap();

    let other = lock.clone();
    let t0 = Instant::now();
    let busy = tokio::spawn(async move {
        other
            .try_lock_for(Duration::from_millis(300), Some(Duration::from_secs(1)))
            .await
            .unwrap()
            .is_none()
    });
    assert!(busy.await.unwrap(), "the lock is held by another task");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_millis(1_500),
        "{waited:?}"
    );
    held.unlock().await.unwrap();

    let g = lock
        .try_lock_for(Duration::from_millis(300), Some(Duration::from_millis(800)))
        .await
        .unwrap()
        .expect("free now");
    assert!(!g.is_watchdog());
    let pttl: i64 = s.cmd(&["PTTL", "nu:lease"]);
    assert!(pttl > 0 && pttl <= 800, "{pttl}");
    tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("a fixed lease guard is lost when its lease ends");
    assert!(g.is_lost());
    // `lost()` errs early: the lease is counted from the acquire's send, Redis counts it
    // from the script's run, so the key may outlive the signal by a round trip (and by
    // Redis's millisecond clock). It must be gone soon after, not at once.
    let gone = Instant::now();
    while lock.is_locked().await.unwrap() {
        assert!(
            gone.elapsed() < Duration::from_millis(200),
            "key outlived lost()"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Unlocking a lease that ran out: a typed error or Ok, never a panic.
    let r = g.unlock().await;
    assert!(
        r.is_ok() || matches!(r, Err(Error::NotHeld { .. }) | Err(Error::LeaseLost { .. })),
        "{r:?}"
    );
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_guard_hears_of_a_force_unlock_through_lost() {
    let s = RedisServer::start();
    let client = Client::builder(s.url())
        .watchdog_timeout(Duration::from_millis(1_500))
        .build()
        .await
        .unwrap();
    let lock = client.lock("nu:wd");
    let g = lock.lock().await.unwrap();
    assert!(g.is_watchdog());
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert!(!g.is_lost(), "the watchdog kept it past one timeout");
    let pttl: i64 = s.cmd(&["PTTL", "nu:wd"]);
    assert!(pttl > 0, "{pttl}");

    // Someone else (another process) force-unlocks it.
    let other = Client::connect(s.url()).await.unwrap();
    assert!(other.lock("nu:wd").force_unlock().await.unwrap());
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("lost() within one renewal period (500 ms) plus slack");
    eprintln!("lost() after {:?}", t0.elapsed());
    assert!(g.is_lost());
    let r = g.unlock().await;
    assert!(r.is_err(), "unlocking a lost hold reports it: {r:?}");
    eprintln!("unlock of a lost guard: {r:?}");
    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_peer_and_this_crate_exclude_and_wake_each_other() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu:shared");

    // Redisson holds: we are refused, then woken by its unlock message.
    assert_eq!(redisson_acquire(&s, "nu:shared", 30_000), None);
    assert!(lock.try_lock().await.unwrap().is_none());
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            let at = Instant::now();
            g.unlock().await.unwrap();
            at
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert_eq!(redisson_unlock(&s, "nu:shared"), Some(1));
    let granted = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by Redisson's 0, not by the 30 s TTL")
        .unwrap();
    let woke = granted.duration_since(released);
    assert!(woke < Duration::from_millis(500), "{woke:?}");

    // We hold: Redisson is refused with our TTL, and every message on the channel
    // decodes as an integer (Redisson's LongCodec).
    let mut sub = redis::Client::open(s.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut ps = sub.as_pubsub();
    ps.subscribe(channel_name("nu:shared")).unwrap();
    ps.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let g = lock.lock().await.unwrap();
    let pttl = redisson_acquire(&s, "nu:shared", 30_000).expect("busy");
    assert!(pttl > 0);
    g.unlock().await.unwrap();
    let msg = ps.get_message().expect("our release publishes");
    let payload: String = msg.get_payload().unwrap();
    assert!(payload.parse::<i64>().is_ok(), "{payload:?}");
    assert_eq!(
        redisson_acquire(&s, "nu:shared", 30_000),
        None,
        "free for Redisson"
    );
    assert_eq!(redisson_unlock(&s, "nu:shared"), Some(1));
    drop(ps);
    client.shutdown().await.unwrap();
}

#[cfg(feature = "cli")]
fn rlock(s: &RedisServer, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlock"))
        .arg("--url")
        .arg(s.url())
        .args(args)
        .output()
        .expect("the rlock binary runs")
}

#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rlock_tool_inspects_watches_and_force_unlocks() {
    let s = RedisServer::start();
    let client = Client::builder(s.url())
        .name("newuser")
        .watchdog_timeout(Duration::from_millis(1_500))
        .build()
        .await
        .unwrap();
    let lock = client.lock("nu:cli");

    let missing = rlock(&s, &["inspect", "nu:cli"]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");

    let watch = Command::new(env!("CARGO_BIN_EXE_rlock"))
        .arg("--url")
        .arg(s.url())
        .args(["watch", "nu:cli", "--for", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;

    let g = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = rlock(&s, &["inspect", "nu:cli"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("inspect:\n{text}");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text.contains(g.holder_field()), "{text}");
    // Two lock() calls, one count in Redis: the nested one was served by the client.
    assert!(text.contains("(holds 1)"), "{text}");
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    assert!(text.contains("newuser"), "the client's name: {text}");
    inner.unlock().await.unwrap();

    // A waiter in another client, woken at once by the force unlock.
    let other = Client::connect(s.url()).await.unwrap();
    let ol = other.lock("nu:cli");
    let waiter = tokio::spawn(async move {
        let g = ol.lock().await.unwrap();
        let at = Instant::now();
        tokio::time::sleep(Duration::from_millis(200)).await;
        g.unlock().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    let fu = rlock(&s, &["force-unlock", "nu:cli"]);
    assert_eq!(fu.status.code(), Some(0), "{fu:?}");
    let woke = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter wakes at once")
        .unwrap();
    assert!(woke.duration_since(t0) < Duration::from_millis(1_000));
    tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("the holder hears of it");

    let watched = tokio::task::spawn_blocking(move || watch.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let events = String::from_utf8_lossy(&watched.stdout).into_owned();
    eprintln!("watch:\n{events}");
    assert_eq!(watched.status.code(), Some(0), "{watched:?}");
    assert!(events.contains("acquired"), "{events}");
    assert!(events.contains("force-unlock"), "{events}");
    assert!(events.contains("released"), "{events}");

    // A hash of application data is refused with exit 4 and left alone.
    let _: () = s.cmd(&["HSET", "nu:data", "name", "x"]);
    let data = rlock(&s, &["force-unlock", "nu:data"]);
    assert_eq!(data.status.code(), Some(4), "{data:?}");
    let still: i64 = s.cmd(&["EXISTS", "nu:data"]);
    assert_eq!(still, 1);
    let bad = rlock(&s, &["inspect"]);
    assert_eq!(bad.status.code(), Some(2));

    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_a_new_user_might_pass_gets_typed_errors() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu:bad");
    let r = lock.lock_with_lease(Duration::ZERO).await;
    eprintln!("lease 0: {r:?}");
    assert!(r.is_err());
    let r = lock.lock_with_lease(Duration::MAX).await;
    eprintln!("lease MAX: {r:?}");
    assert!(r.is_err());
    let r = lock
        .try_lock_for(Duration::ZERO, Some(Duration::from_secs(1)))
        .await;
    eprintln!("wait 0: {:?}", r.as_ref().map(|g| g.is_some()));
    drop(r);
    let r = lock
        .try_lock_for(Duration::MAX, Some(Duration::from_secs(1)))
        .await;
    eprintln!("wait MAX: {:?}", r.as_ref().map(|g| g.is_some()));
    drop(r);
    let r = client.lock("").try_lock().await;
    eprintln!("empty name: {:?}", r.as_ref().map(|g| g.is_some()));
    assert!(matches!(r, Err(Error::EmptyName)));
    for name in ["a{b", "{}x", "a}b", "\u{0}", "x y"] {
        let l = client.lock(name);
        let g = l.try_lock().await;
        eprintln!("{name:?}: {:?}", g.as_ref().map(|g| g.is_some()));
        if let Ok(Some(g)) = g {
            g.unlock().await.unwrap();
        }
    }
    let _: () = s.cmd(&["SET", "nu:str", "1"]);
    let r = client.lock("nu:str").try_lock().await;
    eprintln!("string key: {:?}", r.as_ref().map(|g| g.is_some()));
    assert!(matches!(r, Err(Error::WrongType { .. })));
    client.shutdown().await.unwrap();
    let r = lock.try_lock().await;
    eprintln!("after shutdown: {:?}", r.as_ref().map(|g| g.is_some()));
    assert!(matches!(r, Err(Error::Closed)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_wait_on_a_busy_lock_waits_without_panicking() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu:huge");
    let held = lock.lock().await.unwrap();
    for wait in [
        Duration::MAX,
        redis_rlock::MAX_DURATION,
        Duration::from_secs(u64::MAX / 2),
    ] {
        let other = lock.clone();
        let t = tokio::spawn(async move {
            other
                .try_lock_for(wait, Some(Duration::from_secs(1)))
                .await
                .map(|g| g.is_some())
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!t.is_finished(), "{wait:?}: {:?}", t.await);
        t.abort();
        let r = t.await;
        assert!(
            r.as_ref().is_err_and(|e| e.is_cancelled()),
            "{wait:?}: {r:?}"
        );
    }
    held.unlock().await.unwrap();
    client.shutdown().await.unwrap();
}

/// A user's `try_lock()` polling loop (the pattern of Redisson's `tryLock()` pollers) on
/// a lock that 2 clients x 2 tasks of this crate contend for with `lock()` (1 ms holds),
/// for 2.5 s. Returns the poller's grants, its tries and the others' grants.
async fn poll_while_others_contend(poller_turn_window: Option<Duration>) -> (u32, u32, u32) {
    let s = RedisServer::start();
    let run = Duration::from_millis(2_500);
    let mut tasks = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..2 {
        let c = Client::connect(s.url()).await.unwrap();
        for _ in 0..2 {
            let lock = c.lock("nu:poll");
            tasks.push(tokio::spawn(async move {
                let end = Instant::now() + run;
                let mut n = 0u32;
                while Instant::now() < end {
                    let g = lock.lock().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    g.unlock().await.unwrap();
                    n += 1;
                }
                n
            }));
        }
        clients.push(c);
    }
    let mut b = Client::builder(s.url());
    if let Some(w) = poller_turn_window {
        b = b.turn_window(w);
    }
    let poller = b.build().await.unwrap();
    let lock = poller.lock("nu:poll");
    let end = Instant::now() + run;
    let (mut got, mut tries) = (0u32, 0u32);
    while Instant::now() < end {
        tries += 1;
        if let Some(g) = lock.try_lock().await.unwrap() {
            got += 1;
            g.unlock().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut others = 0;
    for t in tasks {
        others += t.await.unwrap();
    }
    eprintln!("poller (turn window {poller_turn_window:?}): {got} grants in {tries} tries; lock() tasks: {others} grants");
    (got, tries, others)
}

/// A new user's finding: with the default turn window the poller was starved (0-1 grants
/// in 749-775 tries against 910-944 grants to the others, six runs): every release either
/// left the lock held or gave a waiting client the turn, and `try_lock` respected turns
/// without ever joining the line. A single try now takes a free lock during another
/// client's turn, as Redisson's own poller does (`redisson_peers`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_lock_poller_of_this_crate_gets_the_lock_while_others_contend() {
    let (got, tries, others) = poll_while_others_contend(None).await;
    // A Redisson poller gets 43-73 grants in the same shape (`redisson_peers`).
    assert!(
        got * 50 >= tries,
        "the poller got the lock {got} times in {tries} tries ({others} grants to others)"
    );
}

/// A poller whose client has turns off ignores turns too, as a Redisson client does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_lock_poller_with_turns_off_gets_the_lock_while_others_contend() {
    let (got, tries, others) = poll_while_others_contend(Some(Duration::ZERO)).await;
    // A Redisson poller gets 43-73 grants in the same shape (`redisson_peers`).
    assert!(
        got * 50 >= tries,
        "the poller got the lock {got} times in {tries} tries ({others} grants to others)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_guards_released_out_of_order_or_dropped_leave_the_right_state() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let lock = client.lock("nu:order");
    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    outer.unlock().await.unwrap();
    assert!(lock.is_locked().await.unwrap(), "the inner hold remains");
    let other = Client::connect(s.url()).await.unwrap();
    assert!(other.lock("nu:order").try_lock().await.unwrap().is_none());
    // The guard moves to another task and is dropped there.
    tokio::spawn(async move { drop(inner) }).await.unwrap();
    let g = other
        .lock("nu:order")
        .try_lock_for(Duration::from_secs(2), None)
        .await
        .unwrap()
        .expect("a dropped guard's hold is released in the background");
    g.unlock().await.unwrap();
    client.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// A URL that does not parse is a bad argument (exit 2), not an unreachable server
/// (exit 3), as `rlock --help` and the README tell the codes apart.
#[cfg(feature = "cli")]
#[test]
fn rlock_with_a_url_that_does_not_parse_exits_with_the_bad_arguments_code() {
    for url in ["http://127.0.0.1:6379", "not a url"] {
        let out = Command::new(env!("CARGO_BIN_EXE_rlock"))
            .args(["--url", url, "list"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {err}");
        assert!(!err.contains("cannot reach"), "{url}: {err}");
    }
}
