//! A second newcomer's programs under contention, each on a real redis-server: `lock()`
//! futures dropped (in `select!`, cut short, at a turn), services of several tasks and of
//! several clients, a Java service's waiter (Redisson's scripts) among them, and a single
//! try during another client's turn.

mod common;
mod newuser2_peer;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::newcomer::{connect_two, gone_soon, shut_down, watchdog_client};
use common::redisson_waiter::{acquire, no_wake_all, sleep_until_unlock_message, subscribed};
use common::{eventually, RedisServer};
use newuser2_peer::{java_acquire, java_unlock, keys_without_ttl, JAVA_FIELD};
use redis_rlock::protocol::channel_name;
use redis_rlock::Client;

/// A `lock()` dropped by `select!` while another client holds the lock: no subscription,
/// no place in the line, and no hold appears when the holder lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_future_dropped_in_select_leaves_nothing() {
    let s = RedisServer::start();
    let (holder, client) = connect_two(&s).await;
    let name = "nu2:select";
    let held = holder.lock(name).lock().await.unwrap();

    let lock = client.lock(name);
    for round in 0..5u32 {
        tokio::select! {
            g = lock.lock() => panic!("granted while held: {:?}", g.map(|g| g.holder_field().to_string())),
            _ = tokio::time::sleep(Duration::from_millis(40 + 30 * u64::from(round))) => {}
        }
    }
    let line = "redisson_lock_clients:{nu2:select}";
    assert!(
        eventually(Duration::from_secs(2), || {
            let ids: Vec<String> = s.cmd(&["LRANGE", line, "0", "-1"]);
            ids.is_empty()
        })
        .await,
        "the dropped waiter's client stayed in line"
    );
    assert!(
        eventually(Duration::from_secs(2), || s.numsub(&channel_name(name))
            <= 1)
        .await,
        "the dropped waiter kept its subscription (the holder's client may linger)"
    );
    held.unlock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        s.cmd::<i64>(&["EXISTS", name]),
        0,
        "a dropped lock() took a hold"
    );
    assert!(!lock.is_held_by_current_task().await.unwrap());
    let g = lock.try_lock().await.unwrap().expect("free");
    g.unlock().await.unwrap();
    assert_eq!(keys_without_ttl(&s, &[]), Vec::<String>::new());
    shut_down(&[&holder, &client]).await;
}

/// Runs `tasks` tasks per client, each taking the lock `rounds` times with a short
/// critical section; returns the grants per client. Panics on an overlap.
async fn contend(clients: &[Client], name: &str, tasks: usize, rounds: u64) -> Vec<u64> {
    let inside = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let counts: Vec<Arc<AtomicU64>> = clients.iter().map(|_| Arc::default()).collect();
    for (i, c) in clients.iter().enumerate() {
        for _ in 0..tasks {
            let (lock, inside, count) = (c.lock(name), inside.clone(), counts[i].clone());
            handles.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let g = lock.lock().await.unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.store(false, Ordering::SeqCst);
                    g.unlock().await.unwrap();
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    let all = async {
        for h in handles {
            h.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("contention finished within 60 s");
    counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_of_several_tasks_on_one_client_shares_the_lock() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let counts = contend(std::slice::from_ref(&client), "nu2:svc1", 6, 40).await;
    assert_eq!(counts, vec![240]);
    let st = client.stats();
    assert_eq!(st.acquisitions, 240);
    assert_eq!(st.releases, 240);
    assert!(
        st.handovers > 100,
        "waiting tasks are handed the lock: {st:?}"
    );
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu2:svc1"]), 0);
    assert_eq!(keys_without_ttl(&s, &[]), Vec::<String>::new());
    client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_of_several_clients_shares_the_lock() {
    let s = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Client::connect(s.url()).await.unwrap());
    }
    let t0 = Instant::now();
    let counts = contend(&clients, "nu2:svc3", 2, 40).await;
    eprintln!("3 clients x 2 tasks x 40 rounds in {:?}", t0.elapsed());
    assert_eq!(counts, vec![80, 80, 80]);
    assert_eq!(s.cmd::<i64>(&["EXISTS", "nu2:svc3"]), 0);
    assert!(
        eventually(Duration::from_secs(2), || keys_without_ttl(&s, &[])
            .is_empty())
        .await,
        "{:?}",
        keys_without_ttl(&s, &[])
    );
    for c in clients {
        c.shutdown().await.unwrap();
    }
}

/// A Java service's `lock()` (Redisson's acquire script, then a wait on the channel for
/// `0`, bounded by the TTL) against two clients of this crate looping on the lock. It must
/// get in soon, and the messages it hears on the channel must all be ones Redisson knows
/// or ignores (never `1`, which would wake every Redisson waiter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_java_lock_waiter_gets_in_while_two_clients_contend() {
    java_waiter_against(2, 2).await;
}

/// As above, against one client of four tasks, which hand the lock to each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_java_lock_waiter_gets_in_while_one_client_hands_over() {
    java_waiter_against(1, 4).await;
}

async fn java_waiter_against(n_clients: usize, tasks: usize) {
    let s = RedisServer::start();
    let name = "nu2:java";
    let mut clients = Vec::new();
    for _ in 0..n_clients {
        clients.push(Client::connect(s.url()).await.unwrap());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    for c in &clients {
        for _ in 0..tasks {
            let (lock, stop) = (c.lock(name), stop.clone());
            loops.push(tokio::spawn(async move {
                let t0 = Instant::now();
                while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(20) {
                    let g = lock.lock().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    g.unlock().await.unwrap();
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let url = s.url();
    let java = tokio::task::spawn_blocking(move || {
        subscribed(&url, name, |conn, pubsub| {
            let mut heard = Vec::new();
            let t0 = Instant::now();
            let mut tries = 0u32;
            loop {
                tries += 1;
                let Some(ttl) = acquire(conn, name, 30_000, JAVA_FIELD) else {
                    break;
                };
                if t0.elapsed() > Duration::from_secs(10) {
                    break;
                }
                // As Redisson's waiter: sleep until a 0 (a 1 would wake every waiter), at
                // most the holder's TTL; other numbers are passed over.
                let until = Instant::now() + Duration::from_millis(ttl.clamp(1, 1_000) as u64);
                sleep_until_unlock_message(pubsub, until, &mut heard);
            }
            (t0.elapsed(), tries, heard)
        })
    });
    let (waited, tries, heard) = java.await.unwrap();
    let got = java_acquire(&s, name, 30_000).is_none();
    stop.store(true, Ordering::Relaxed);
    eprintln!("java waited {waited:?}, {tries} tries, heard {heard:?}");
    assert!(got, "the Java waiter never got the lock in 10 s");
    assert!(
        waited < Duration::from_secs(2),
        "the Java waiter waited {waited:?}"
    );
    no_wake_all(&heard);
    assert!(
        heard
            .iter()
            .all(|&m| m == 0 || (1i64 << 48..1i64 << 50).contains(&m)),
        "only 0 and turn messages on the channel: {heard:?}"
    );
    java_unlock(&s, name, 7);
    java_unlock(&s, name, 8);
    for l in loops {
        tokio::time::timeout(Duration::from_secs(25), l)
            .await
            .unwrap()
            .unwrap();
    }
    for c in clients {
        c.shutdown().await.unwrap();
    }
}

/// The README (and protocol 2.6) say a single `try_lock()` takes a free lock during
/// another client's turn, as Redisson's `tryLock()` does, while a waiting call waits for
/// the turn. Another client's turn is set by hand here, for a client that never comes;
/// the client's window covers it (a turn longer than a client's own window plus 2 ms is
/// foreign data to it, `docs/protocol.md` 2.6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_try_takes_a_free_lock_during_another_clients_turn_a_wait_does_not() {
    let s = RedisServer::start();
    let client = Client::builder(s.url())
        .turn_window(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let name = "nu2:turn";
    let turn = "redisson_lock_turn:{nu2:turn}";
    let _: () = s.cmd(&[
        "SET",
        turn,
        "ffffffff-0000-0000-0000-000000000000",
        "PX",
        "1500",
    ]);
    let lock = client.lock(name);
    let waiting = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock_for(Duration::from_millis(300), None).await })
    };
    let r = waiting.await.unwrap().unwrap();
    assert!(
        r.is_none(),
        "a waiting call waits for the other client's turn"
    );
    let g = lock.try_lock().await.unwrap();
    assert!(
        g.is_some(),
        "a single try takes a free lock during another client's turn"
    );
    drop(g);
    let line = "redisson_lock_clients:{nu2:turn}";
    assert!(
        eventually(Duration::from_secs(2), || s
            .cmd::<Vec<String>>(&["LRANGE", line, "0", "-1"])
            .is_empty())
        .await,
        "the waiting call that gave up left the line"
    );
    client.shutdown().await.unwrap();
}

/// One waiter of a client is dropped at varied moments right after another client's
/// release, while a second waiter of the same client waits, with and without an idle
/// subscriber outside the line on the channel (which makes the turn's client yield 1 ms,
/// protocol 2.6). The second waiter must always get the lock soon, never at the 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_at_its_turn_leaves_the_turn_to_its_sibling() {
    let s = RedisServer::start();
    let (holder, client) = connect_two(&s).await;
    let name = "nu2:sibling";
    let mut outsider: Option<redis::Connection> = None;
    let mut slowest = Duration::ZERO;
    for round in 0..24u64 {
        if round == 12 {
            let mut c = s.conn();
            redis::cmd("SUBSCRIBE")
                .arg(channel_name(name))
                .exec(&mut c)
                .unwrap();
            outsider = Some(c);
        }
        let held = holder.lock(name).lock().await.unwrap();
        let (a, b) = (client.lock(name), client.lock(name));
        let first = tokio::spawn(async move { a.lock().await.map(drop) });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let second = tokio::spawn(async move {
            let g = b.lock().await.unwrap();
            let t = Instant::now();
            g.unlock().await.unwrap();
            t
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        held.unlock().await.unwrap();
        let released = Instant::now();
        tokio::time::sleep(Duration::from_micros(250 * (round % 12))).await;
        first.abort();
        let got = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the sibling slept past 5 s"))
            .unwrap();
        slowest = slowest.max(got.duration_since(released));
        let _ = first.await;
    }
    eprintln!("slowest sibling grant {slowest:?}");
    drop(outsider);
    assert!(gone_soon(&s, name).await);
    shut_down(&[&holder, &client]).await;
}

/// `lock()` futures cut short at varied points on a free lock (the acquire may be in
/// flight): whatever they took is given back, and the counts balance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_futures_cut_short_on_a_free_lock_leave_no_hold() {
    let s = RedisServer::start();
    let (client, other) = connect_two(&s).await;
    let lock = client.lock("nu2:cut");
    let mut granted = 0;
    let mut free_after = Duration::ZERO;
    for i in 0..40u64 {
        // Cut after a few polls: the acquire is often sent and unanswered then (a
        // timer would not do: tokio's resolution is 1 ms, longer than the round trip).
        let cut = async {
            let t = Instant::now();
            while t.elapsed() < Duration::from_micros(10 * i) {
                tokio::task::yield_now().await;
            }
        };
        tokio::select! {
            biased;
            g = lock.lock() => {
                granted += 1;
                g.unwrap().unlock().await.unwrap();
            }
            _ = cut => {
                // How long until another client can take it: a grant that lands after
                // the cut is given back in the background.
                let t = Instant::now();
                loop {
                    if let Some(g) = other.lock("nu2:cut").try_lock().await.unwrap() {
                        g.unlock().await.unwrap();
                        break;
                    }
                    assert!(t.elapsed() < Duration::from_secs(2), "round {i}: still held");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                free_after = free_after.max(t.elapsed());
            }
        }
    }
    eprintln!("{granted} of 40 granted before the cut; free again after at most {free_after:?}");
    // An acquire already sent finishes in the background, and what it took is given
    // back there (free again for another client within 3-4 ms in the loop above).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        s.cmd::<i64>(&["EXISTS", "nu2:cut"]),
        0,
        "a cut-short lock() left a hold"
    );
    assert!(other.lock("nu2:cut").try_lock().await.unwrap().is_some());
    let st = client.stats();
    eprintln!("{st:?}");
    assert_eq!(st.acquisitions, st.releases, "{st:?}");
    shut_down(&[&client, &other]).await;
}

/// A service on a current-thread runtime (`#[tokio::main(flavor = "current_thread")]`):
/// its tasks take turns with the lock, and the watchdog keeps a hold that outlives the
/// lease while the others wait.
#[tokio::test(flavor = "current_thread")]
async fn a_current_thread_service_shares_the_lock_and_renews() {
    let s = RedisServer::start();
    let client = watchdog_client(&s, Duration::from_millis(600)).await;
    let long = client.lock("nu2:ct").lock().await.unwrap();
    let counts = {
        let c = client.clone();
        let run =
            tokio::spawn(async move { contend(std::slice::from_ref(&c), "nu2:ct", 3, 20).await });
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert!(!long.is_lost(), "renewed on a current-thread runtime");
        assert!(!run.is_finished(), "the others waited for the long hold");
        long.unlock().await.unwrap();
        run.await.unwrap()
    };
    assert_eq!(counts, vec![60]);
    assert!(client.stats().renewals >= 3, "{:?}", client.stats());
    client.shutdown().await.unwrap();
}
