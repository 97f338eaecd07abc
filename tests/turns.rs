//! Turns: clients that wait for a busy lock line up in Redis, and a published release
//! keeps the lock for the client first in line for the turn window (`docs/protocol.md`
//! 2.6). Fair shares across clients; a client that stopped waiting leaves the line.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::turns::{client, line, lined_up, served, take_and_release};
use common::RedisServer;
use redis_rlock::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_client_in_line_gets_the_turn_and_a_late_waiter_waits_for_it() {
    let s = RedisServer::start();
    let (a, b, c) = (
        client(&s, Duration::from_millis(300)).await,
        client(&s, Duration::from_millis(300)).await,
        client(&s, Duration::from_millis(300)).await,
    );
    let held = a.lock("tn:a").lock().await.unwrap();
    let waiter = tokio::spawn({
        let l = b.lock("tn:a");
        async move {
            let g = l.lock().await.unwrap();
            let at = Instant::now();
            tokio::time::sleep(Duration::from_millis(50)).await;
            g.unlock().await.unwrap();
            at
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(line(&s, "tn:a"), [b.id()], "the waiting client is in line");
    held.unlock().await.unwrap();
    // During b's turn the free lock is not for a waiting call of c's...
    let tried = c
        .lock("tn:a")
        .try_lock_for(Duration::from_millis(20), None)
        .await
        .unwrap();
    assert!(tried.is_none(), "c took the lock during b's turn");
    let got_at = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(
        line(&s, "tn:a").is_empty(),
        "b is still in line after its grant"
    );
    // ... and once b has had it, it is free for anyone.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(got_at.elapsed() >= Duration::from_millis(50));
    let g = c
        .lock("tn:a")
        .try_lock()
        .await
        .unwrap()
        .expect("free again");
    g.unlock().await.unwrap();
}

/// A single `try_lock` takes a free lock during another client's turn, as a Redisson
/// client's `tryLock()` does: it never joins the line, so a turn of its own would never
/// come, and a `try_lock()` loop would starve while clients of this crate contend
/// (`newuser::a_try_lock_poller_of_this_crate_gets_the_lock_while_others_contend`). The
/// turn here is a dead client's, so nobody else takes the lock first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_try_takes_a_free_lock_during_another_clients_turn() {
    let s = RedisServer::start();
    let window = Duration::from_millis(500);
    let (a, c) = (client(&s, window).await, client(&s, window).await);
    let held = a.lock("tn:try").lock().await.unwrap();
    let key = redis_rlock::protocol::clients_key("tn:try");
    let _: () = s.cmd(&["RPUSH", &key, "00000000-0000-4000-8000-00000000dead"]);
    let _: () = s.cmd(&["PEXPIRE", &key, "60000"]);
    held.unlock().await.unwrap();
    let turn: Option<String> = s.cmd(&["GET", &redis_rlock::protocol::turn_key("tn:try")]);
    assert_eq!(
        turn.as_deref(),
        Some("00000000-0000-4000-8000-00000000dead")
    );
    let g = c
        .lock("tn:try")
        .try_lock()
        .await
        .unwrap()
        .expect("a single try takes the free lock during another client's turn");
    g.unlock().await.unwrap();
}

/// A client whose only waiter ran out of time is out of the line when `try_lock_for`
/// returns: a release right after it gives no turn to anyone, and a third client's
/// `try_lock` gets the free lock (several rounds: a leave sent in the background raced
/// the release and lost about half of the time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stopped_waiting_leaves_the_line() {
    let s = RedisServer::start();
    let (a, b, c) = (
        client(&s, Duration::from_secs(2)).await,
        client(&s, Duration::from_secs(2)).await,
        client(&s, Duration::from_secs(2)).await,
    );
    for round in 0..10 {
        let held = a.lock("tn:b").lock().await.unwrap();
        let gave_up = b
            .lock("tn:b")
            .try_lock_for(Duration::from_millis(200), None)
            .await
            .unwrap();
        assert!(gave_up.is_none());
        assert!(
            line(&s, "tn:b").is_empty(),
            "round {round}: b left its place in line behind: {:?}",
            line(&s, "tn:b")
        );
        held.unlock().await.unwrap();
        // Nobody waits, so no turn holds the lock back (the window is 2 s).
        let g = c.lock("tn:b").try_lock().await.unwrap();
        assert!(
            g.is_some(),
            "round {round}: a turn kept the lock for a client that left"
        );
        g.unwrap().unlock().await.unwrap();
    }
    // A waiter dropped while it waits leaves in the background.
    let held = a.lock("tn:b").lock().await.unwrap();
    let dropped = tokio::time::timeout(Duration::from_millis(100), b.lock("tn:b").lock()).await;
    assert!(dropped.is_err());
    assert!(
        common::eventually(Duration::from_secs(2), || line(&s, "tn:b").is_empty()).await,
        "a dropped waiter left its place in line behind"
    );
    held.unlock().await.unwrap();
    assert!(c.lock("tn:b").try_lock().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_nobody_takes_ends_with_its_window() {
    let s = RedisServer::start();
    let window = Duration::from_millis(300);
    let (a, c) = (client(&s, window).await, client(&s, window).await);
    let held = a.lock("tn:c").lock().await.unwrap();
    // A client in line that died before its turn came (written as a waiter would).
    let key = redis_rlock::protocol::clients_key("tn:c");
    let _: () = s.cmd(&["RPUSH", &key, "00000000-0000-4000-8000-000000000000"]);
    held.unlock().await.unwrap();
    let started = Instant::now();
    let g = c
        .lock("tn:c")
        .try_lock_for(Duration::from_secs(5), None)
        .await
        .unwrap()
        .expect("taken after the dead client's turn");
    let waited = started.elapsed();
    assert!(
        waited >= window / 2 && waited < window * 4,
        "waited {waited:?} for a {window:?} turn"
    );
    g.unlock().await.unwrap();
}

/// A turn used and held past its window: the other client in line sends no script
/// while the holder keeps the lock, and is woken by its release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_used_past_its_window_costs_the_others_no_script_call() {
    let s = RedisServer::start();
    let window = Duration::from_millis(150);
    let (a, b, c) = (
        client(&s, window).await,
        client(&s, window).await,
        client(&s, window).await,
    );
    let held = a.lock("tn:long").lock().await.unwrap();
    let (took_tx, took_rx) = tokio::sync::oneshot::channel();
    let (free_tx, free_rx) = tokio::sync::oneshot::channel::<()>();
    let long = tokio::spawn({
        let l = b.lock("tn:long");
        async move {
            let g = l.lock().await.unwrap();
            took_tx.send(()).unwrap();
            free_rx.await.unwrap();
            g.unlock().await.unwrap();
        }
    });
    assert!(common::eventually(Duration::from_secs(2), || line(&s, "tn:long") == [b.id()]).await);
    let next = take_and_release(c.lock("tn:long"));
    // Both hear the lock's channel, and c's attempt after its subscription is answered.
    let turns = redis_rlock::protocol::channel_name("tn:long");
    assert!(
        common::eventually(Duration::from_secs(2), || line(&s, "tn:long")
            == [b.id(), c.id()]
            && s.numsub(&turns) == 2)
        .await
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let c_busy = c.stats().busy;
    held.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), took_rx)
        .await
        .expect("b never took its turn")
        .unwrap();
    let scripts = || s.calls("evalsha") + s.calls("eval");
    let before = scripts();
    tokio::time::sleep(window * 3).await;
    assert_eq!(
        scripts(),
        before,
        "script calls while b held the lock past its turn (c answered busy {} times)",
        c.stats().busy - c_busy
    );
    let released = Instant::now();
    free_tx.send(()).unwrap();
    long.await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("c slept through the release")
        .unwrap();
    assert!(
        got - released < window,
        "c took {:?} after the release",
        got - released
    );
}

/// `per` tasks of each client take `name` in a loop for `run`, doing `work` under the
/// lock: the grants of each client and the longest wait.
async fn contend<W, F>(
    clients: &[Client],
    per: usize,
    name: &str,
    run: Duration,
    work: W,
) -> (Vec<u64>, Duration)
where
    W: Fn() -> F + Clone + Send + 'static,
    F: std::future::Future<Output = ()> + Send,
{
    let until = Instant::now() + run;
    let longest = Arc::new(AtomicU64::new(0));
    let counts: Vec<Arc<AtomicU64>> = clients.iter().map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        for _ in 0..per {
            let (lock, n, longest) = (c.lock(name), counts[i].clone(), longest.clone());
            let work = work.clone();
            tasks.push(tokio::spawn(async move {
                while Instant::now() < until {
                    let asked = Instant::now();
                    let left = until.saturating_duration_since(asked);
                    let Ok(Some(g)) = lock.try_lock_for(left, None).await else {
                        break;
                    };
                    longest.fetch_max(asked.elapsed().as_micros() as u64, Ordering::Relaxed);
                    n.fetch_add(1, Ordering::Relaxed);
                    work().await;
                    g.unlock().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .unwrap()
            .unwrap();
    }
    (
        counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        Duration::from_micros(longest.load(Ordering::Relaxed)),
    )
}

/// Four clients (as four service instances) of four tasks each on one lock held 1 ms.
async fn shares(s: &RedisServer, window: Duration) -> (Vec<u64>, Duration) {
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(s, window).await);
    }
    let hold = || tokio::time::sleep(Duration::from_millis(1));
    contend(&clients, 4, "tn:share", Duration::from_secs(3), hold).await
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_share_a_contended_lock_fairly() {
    let s = RedisServer::start();
    let (with, longest) = shares(&s, redis_rlock::DEFAULT_TURN_WINDOW).await;
    println!("FIGURE shares_with_turns {with:?} longest wait {longest:?}");
    let (without, longest_without) = shares(&s, Duration::ZERO).await;
    println!("FIGURE shares_without_turns {without:?} longest wait {longest_without:?}");
    let max = *with.iter().max().unwrap() as f64;
    let min = *with.iter().min().unwrap() as f64;
    assert!(min > 0.0 && max / min <= 1.5, "unfair shares {with:?}");
    assert!(longest < Duration::from_secs(1), "a wait of {longest:?}");
}

/// Four clients (four service instances) of two tasks each, each task in a loop of a
/// read-modify-write under the lock. While one task of a client holds the lock, the
/// other waits, and the holder's next call waits again at once: the client must stay
/// in line throughout. It did not when a grant to one of its waiters took it out of the
/// line while the other's first attempt, in flight, found it there (and so did not join):
/// the client then waited without a place until the line ran empty, 230-600 lock cycles.
#[tokio::test(flavor = "multi_thread")]
async fn clients_of_two_tasks_each_keep_their_place_in_line() {
    let s = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&s, redis_rlock::DEFAULT_TURN_WINDOW).await);
    }
    let conn = redis::Client::open(s.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let rmw = move || {
        let mut conn = conn.clone();
        async move {
            let v: Option<u64> = redis::cmd("GET")
                .arg("tn:rmw:n")
                .query_async(&mut conn)
                .await
                .unwrap();
            let _: () = redis::cmd("SET")
                .arg("tn:rmw:n")
                .arg(v.unwrap_or(0) + 1)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    };
    let started = Instant::now();
    let (per, longest) = contend(&clients, 2, "tn:rmw", Duration::from_secs(2), rmw).await;
    let total: u64 = per.iter().sum();
    let counter: u64 = s.cmd(&["GET", "tn:rmw:n"]);
    let cycle = started.elapsed().as_micros() as f64 / total as f64;
    let cycles = longest.as_micros() as f64 / cycle;
    println!("FIGURE two_task_clients {per:?} longest wait {cycles:.1} cycles");
    assert_eq!(counter, total, "lost updates");
    assert!(total > 100, "only {total} grants");
    assert!(
        cycles <= 150.0,
        "a wait of {cycles:.1} lock cycles ({per:?})"
    );
}

/// Eight clients of one task each (eight service instances) take one lock in turn,
/// with no hold and with a 1 ms hold. A release gives the turn to the next client in
/// line, and the waiters of the other clients keep sleeping: per acquisition Redis runs
/// the unlock, the releasing client's next attempt (answered busy) and the acquire of
/// the client whose turn it is (3.0; 9.5 without turns).
#[tokio::test(flavor = "multi_thread")]
async fn contended_clients_cost_few_script_calls_per_acquisition() {
    let s = RedisServer::start();
    let mut clients = Vec::new();
    let window = std::env::var("TW")
        .map(|v| Duration::from_millis(v.parse().unwrap()))
        .unwrap_or(redis_rlock::DEFAULT_TURN_WINDOW);
    for _ in 0..8 {
        clients.push(client(&s, window).await);
    }
    for hold in [Duration::ZERO, Duration::from_millis(1)] {
        let calls_before = s.calls("evalsha") + s.calls("eval");
        let acquired = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let until = started + Duration::from_secs(2);
        let mut tasks = Vec::new();
        for c in &clients {
            let (lock, acquired) = (c.lock("tn:calls"), acquired.clone());
            tasks.push(tokio::spawn(async move {
                let mut mine = 0u64;
                while Instant::now() < until && mine < 2_000 {
                    let left = until.saturating_duration_since(Instant::now());
                    let Ok(Some(g)) = lock.try_lock_for(left, None).await else {
                        break;
                    };
                    mine += 1;
                    acquired.fetch_add(1, Ordering::Relaxed);
                    if !hold.is_zero() {
                        tokio::time::sleep(hold).await;
                    }
                    g.unlock().await.unwrap();
                }
                mine
            }));
        }
        let mut per_client = Vec::new();
        for t in tasks {
            per_client.push(
                tokio::time::timeout(Duration::from_secs(30), t)
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        let n = acquired.load(Ordering::Relaxed);
        let calls = s.calls("evalsha") + s.calls("eval") - calls_before;
        let per = calls as f64 / n as f64;
        let rate = n as f64 / started.elapsed().as_secs_f64();
        let deferred: u64 = clients.iter().map(|c| c.stats().turns_deferred).sum();
        println!(
            "FIGURE script_calls_per_acquisition hold {hold:?}: {per:.2} ({calls} calls, {n} acquisitions, {rate:.0}/s, per client {per_client:?}, unlock messages deferred {deferred})"
        );
        assert!(n > 50, "only {n} acquisitions");
        assert!(per <= 4.0, "{per:.2} script calls per acquisition");
    }
}

/// A client whose waiter took the lock from Redis, after waiting in line, is out of the
/// line for good: its own release, rounds later, gives no turn to it with nobody of it
/// waiting, so another client's lock right after is not held back for the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_granted_by_redis_after_waiting_gets_no_turn_later() {
    let s = RedisServer::start();
    let window = Duration::from_millis(300);
    let (a, c) = (client(&s, window).await, client(&s, window).await);
    let turn_key = redis_rlock::protocol::turn_key("tn:out");
    for round in 0..3 {
        let held = a.lock("tn:out").lock().await.unwrap();
        let waiter = tokio::spawn({
            let l = c.lock("tn:out");
            async move { l.lock().await.unwrap().unlock().await.unwrap() }
        });
        assert!(
            common::eventually(Duration::from_secs(2), || line(&s, "tn:out") == [c.id()]).await,
            "round {round}: c never lined up"
        );
        held.unlock().await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap_or_else(|_| panic!("round {round}: c never got its turn"))
            .unwrap();
        assert_eq!(
            line(&s, "tn:out"),
            Vec::<String>::new(),
            "round {round}: line"
        );
        let turn: Option<String> = s.cmd(&["GET", &turn_key]);
        assert_eq!(turn, None, "round {round}: c's release gave a turn");
        let took = Instant::now();
        let again = a.lock("tn:out").try_lock().await.unwrap();
        assert!(again.is_some(), "round {round}: a free lock was refused");
        again.unwrap().unlock().await.unwrap();
        assert!(
            took.elapsed() < window / 2,
            "round {round}: {:?}",
            took.elapsed()
        );
    }
}

/// A client already waiting when the lock's release gives the turn to a client that is
/// gone (it died in line): its waiter let the unlock message pass, as the turn was
/// another's, and is woken when that turn ends unused, not when the holder's 30 s lease
/// would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_let_a_dead_clients_turn_pass_is_woken_when_it_ends() {
    let s = RedisServer::start();
    let window = Duration::from_millis(200);
    let (a, c) = (client(&s, window).await, client(&s, window).await);
    for round in 0..3 {
        let held = a.lock("tn:lapse").lock().await.unwrap();
        let waiter = take_and_release(c.lock("tn:lapse"));
        // c is in line and hears the lock's channel; a dead client is put ahead of it.
        let turns = redis_rlock::protocol::channel_name("tn:lapse");
        assert!(
            common::eventually(Duration::from_secs(2), || line(&s, "tn:lapse") == [c.id()]
                && s.numsub(&turns) == 1)
            .await
        );
        let key = redis_rlock::protocol::clients_key("tn:lapse");
        let _: () = s.cmd(&["LPUSH", &key, "00000000-0000-4000-8000-00000000dead"]);
        let deferred = c.stats().turns_deferred;
        let released = Instant::now();
        held.unlock().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the waiter slept through the lapse"))
            .unwrap();
        let took = got - released;
        println!("FIGURE turn_lapse_wake round {round}: {took:?} (window {window:?})");
        assert_eq!(
            c.stats().turns_deferred,
            deferred + 1,
            "the unlock message was let pass"
        );
        assert!(
            took >= window / 2 && took < window + Duration::from_secs(1),
            "round {round}: woken after {took:?}"
        );
    }
}

/// A client whose turn is used by one of its waiters while another still waits goes
/// back in line, at the back: its other waiter hears no unlock message meant for another
/// client's turn, so without its place it would wait for a release with no turn at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_waiters_left_after_its_turn_lines_up_again() {
    let s = RedisServer::start();
    let window = Duration::from_millis(300);
    // Without hand-over, b's second waiter asks Redis (and lines up) instead of queueing
    // behind the first inside b.
    let no_handover = Client::builder(s.url())
        .turn_window(window)
        .handover_limit(0)
        .build()
        .await
        .unwrap();
    let (a, b, c) = (
        client(&s, window).await,
        no_handover,
        client(&s, window).await,
    );
    let held = a.lock("tn:again").lock().await.unwrap();
    let spawn_waiter = |cl: &Client, hold: Duration| {
        let l = cl.lock("tn:again");
        tokio::spawn(async move {
            let g = l.lock().await.unwrap();
            tokio::time::sleep(hold).await;
            g.unlock().await.unwrap();
        })
    };
    let b1 = spawn_waiter(&b, Duration::from_millis(400));
    assert!(common::eventually(Duration::from_secs(2), || line(&s, "tn:again") == [b.id()]).await);
    // Both of b's waiters hold long: whichever takes b's turn, the line can be seen.
    let b2 = spawn_waiter(&b, Duration::from_millis(400));
    let c1 = spawn_waiter(&c, Duration::ZERO);
    assert!(common::eventually(Duration::from_secs(2), || line(&s, "tn:again").len() == 2).await);
    assert_eq!(line(&s, "tn:again"), [b.id(), c.id()]);
    // b's turn: one of its waiters takes the lock; the other still waits, so b is in
    // line again, behind c.
    held.unlock().await.unwrap();
    assert!(
        common::eventually(Duration::from_secs(2), || line(&s, "tn:again")
            == [c.id(), b.id()])
        .await,
        "line after b's turn: {:?}",
        line(&s, "tn:again")
    );
    for t in [b1, b2, c1] {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .unwrap()
            .unwrap();
    }
}

/// A waiter queued behind another of its client (no request of its own) keeps the
/// client's place in line when the first one gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_queued_behind_keeps_its_clients_place_when_the_first_gives_up() {
    let s = RedisServer::start();
    let window = Duration::from_millis(300);
    let (a, b) = (client(&s, window).await, client(&s, window).await);
    let held = a.lock("tn:behind").lock().await.unwrap();
    let first = {
        let l = b.lock("tn:behind");
        tokio::spawn(async move { l.try_lock_for(Duration::from_millis(400), None).await })
    };
    assert!(common::eventually(Duration::from_secs(2), || line(&s, "tn:behind") == [b.id()]).await);
    let second = {
        let l = b.lock("tn:behind");
        tokio::spawn(async move {
            let g = l.lock().await.unwrap();
            g.unlock().await.unwrap();
        })
    };
    assert!(first.await.unwrap().unwrap().is_none(), "the first gave up");
    assert_eq!(
        line(&s, "tn:behind"),
        [b.id()],
        "b left the line while a waiter of it still waits"
    );
    held.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .unwrap()
        .unwrap();
}

/// A waiting call whose first attempt is answered after its deadline (Redis paused)
/// returns a timeout; the busy answer that comes later put its client in line, and the
/// client takes itself out again, so that no turn goes to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_answer_that_came_too_late_takes_its_client_out_of_the_line() {
    let s = RedisServer::start();
    let window = Duration::from_millis(300);
    let (a, b) = (client(&s, window).await, client(&s, window).await);
    let held = a.lock("tn:late").lock().await.unwrap();
    s.signal("STOP");
    let late = b
        .lock("tn:late")
        .try_lock_for(Duration::from_millis(100), None)
        .await;
    s.signal("CONT");
    assert!(
        matches!(late, Err(redis_rlock::Error::Timeout { .. })),
        "{late:?}"
    );
    assert!(
        common::eventually(Duration::from_secs(3), || line(&s, "tn:late").is_empty()).await,
        "the client stayed in line: {:?}",
        line(&s, "tn:late")
    );
    held.unlock().await.unwrap();
}

/// A client whose tasks hand the lock to each other gives way, after a few hand-overs
/// in a row, to another client waiting in line: that client does not wait out the
/// whole run (256 hand-overs, or the client's hand-over window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_hand_overs_gives_way_to_another_client_in_line() {
    let s = RedisServer::start();
    let a = Client::builder(s.url())
        .handover_window(Duration::from_secs(30))
        .build()
        .await
        .unwrap();
    let b = client(&s, redis_rlock::DEFAULT_TURN_WINDOW).await;
    let name = "tn:give";
    let grants = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (lock, grants, stop) = (a.lock(name), grants.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            // Bounded: the test stops it, or 20 s do.
            let until = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                let g = lock.lock_with_lease(Duration::from_secs(10)).await.unwrap();
                grants.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
                g.unlock().await.unwrap();
            }
        }));
    }
    while grants.load(Ordering::Relaxed) < 20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut behind = Vec::new();
    for _ in 0..5 {
        let before = grants.load(Ordering::Relaxed);
        let g = tokio::time::timeout(Duration::from_secs(5), b.lock(name).lock())
            .await
            .expect("b got the lock within 5 s")
            .unwrap();
        behind.push(grants.load(Ordering::Relaxed) - before);
        g.unlock().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    // A few hand-overs before a gives way, and what was in flight when b asked.
    assert!(
        behind.iter().all(|&n| n <= 12),
        "grants of a while b waited, per round: {behind:?}"
    );
}

/// Issue 24, finding 3: the locks `t3` and `{t3}` hash to one slot, and their line and
/// turn were the same keys. A release of `t3` gave the turn to the first client in that
/// line, which waited for `{t3}` only; the client waiting for `t3` was then held off for
/// the whole turn window (here 600 ms). Each name has its own line and turn now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_of_one_name_holds_nobody_off_a_name_of_the_same_slot() {
    let s = RedisServer::start();
    let window = Duration::from_millis(600);
    let (x, y, z, w) = (
        client(&s, window).await,
        client(&s, window).await,
        client(&s, window).await,
        client(&s, window).await,
    );
    let braced = z.lock("{t3}").lock().await.unwrap();
    let plain = x.lock("t3").lock().await.unwrap();
    // `y` waits for `{t3}` first, then `w` for `t3`.
    let other = take_and_release(y.lock("{t3}"));
    lined_up(&s, "{t3}", y.id()).await;
    let waiter = take_and_release(w.lock("t3"));
    lined_up(&s, "t3", w.id()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    plain.unlock().await.unwrap();
    let got = served(waiter, Duration::from_secs(5), "the waiter of t3 got it").await;
    let after = got.saturating_duration_since(released);
    assert!(
        after < Duration::from_millis(300),
        "the waiter got t3 {after:?} after its release (a turn for a waiter of {{t3}})"
    );
    braced.unlock().await.unwrap();
    served(other, Duration::from_secs(5), "the waiter of {t3} got it").await;
}

/// A client whose run of hand-overs ends with its own waiters still in line, first in
/// it, gives the turn to the next client and goes to the back of the line. It gave the
/// turn to itself before (found by an adversarial review), and the other client's
/// waiter was answered "not your turn" while this client's waiters held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_ends_gives_the_turn_to_the_next_client() {
    let s = RedisServer::start();
    let name = "tn:rotate";
    let a = Client::builder(s.url())
        .handover_limit(1)
        .build()
        .await
        .unwrap();
    let b = client(&s, redis_rlock::DEFAULT_TURN_WINDOW).await;
    let held = a.lock(name).lock().await.unwrap();
    // `a`'s other tasks wait; the one handed the lock releases it at once, which ends
    // the run (a limit of 1).
    let a2 = take_and_release(a.lock(name));
    lined_up(&s, name, a.id()).await;
    let a3 = take_and_release(a.lock(name));
    let b1 = take_and_release(b.lock(name));
    lined_up(&s, name, b.id()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    held.unlock().await.unwrap();
    let wait = |t| served(t, Duration::from_secs(5), "served");
    let (a2, a3, b1) = (wait(a2).await, wait(a3).await, wait(b1).await);
    // One of `a`'s waiters is handed the lock, and its release ends the run.
    let (first, second) = (a2.min(a3), a2.max(a3));
    let at = |t: Instant| t.saturating_duration_since(released);
    println!("a {:?} then {:?}, b {:?}", at(first), at(second), at(b1));
    assert!(first < b1, "the hand-over went first");
    assert!(
        b1 < second,
        "the other client's waiter came after this client's ({:?} later)",
        b1 - second
    );
}

/// The messages a release publishes on `channel`, heard by one more subscriber.
fn release_heard(
    s: &RedisServer,
    name: &str,
    field: &str,
    strangers: usize,
    window: i64,
) -> Vec<String> {
    let channel = redis_rlock::protocol::channel_name(name);
    let mut listeners: Vec<redis::Connection> = (0..1 + strangers).map(|_| s.conn()).collect();
    for l in &mut listeners {
        redis::cmd("SUBSCRIBE").arg(&channel).exec(l).unwrap();
    }
    let src = redis_rlock::protocol::script_source("release.lua").unwrap();
    let released: i64 = redis::cmd("EVAL")
        .arg(src)
        .arg(5)
        .arg(name)
        .arg(&channel)
        .arg(format!("redisson_unlock_latch:{{{name}}}:r1"))
        .arg(redis_rlock::protocol::clients_key(name))
        .arg(redis_rlock::protocol::turn_key(name))
        .arg(field)
        .arg(1)
        .arg(0)
        .arg(10_000)
        .arg(window)
        .query(&mut s.conn())
        .unwrap();
    assert_eq!(released, 1, "published");
    let mut pubsub = listeners[0].as_pubsub();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    (0..2)
        .map(|_| pubsub.get_message().unwrap().get_payload().unwrap())
        .collect()
}

/// Two client ids: `A` holds, `B` waits in line.
const A: &str = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
const B: &str = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb";

/// `name` held by client `holder`'s task 1 (its field returned), with `waiting` alone
/// in its line.
fn held_with_line(s: &RedisServer, name: &str, holder: &str, waiting: &str) -> String {
    let field = format!("{holder}:1");
    let _: () = s.cmd(&["HSET", name, &field, "1"]);
    let _: () = s.cmd(&["PEXPIRE", name, "10000"]);
    let line = redis_rlock::protocol::clients_key(name);
    let _: () = s.cmd(&["RPUSH", &line, waiting]);
    let _: () = s.cmd(&["PEXPIRE", &line, "10000"]);
    field
}

/// A release that gives a client the turn while the channel has a subscriber that is no
/// client in the line nor the releasing one (a Redisson waiter, which has no place in
/// the line) asks that client to let it try first: the turn message is 2^49 + n instead
/// of 2^48 + n. The subscriber counted as the turn's client is the test's listener.
#[test]
fn a_turn_given_while_a_stranger_listens_asks_its_client_to_yield() {
    let s = RedisServer::start();
    let (a, b) = (A, B);
    let turn: u64 = redis_rlock::protocol::turn_message(b)
        .unwrap()
        .parse()
        .unwrap();
    // (subscribers besides the turn's client, the window's sign: whether the releasing
    // client says it listens, the turn message expected)
    let cases = [
        (0, 10, turn),
        (1, 10, turn),
        (2, 10, turn + (1 << 48)),
        (0, -10, turn),
        (1, -10, turn + (1 << 48)),
    ];
    for (strangers, window, expected) in cases {
        let name = format!("yield:{strangers}:{window}");
        let field = held_with_line(&s, &name, a, b);
        // Known: b in line, and a (the releasing client, not in line) if it listens.
        let heard = release_heard(&s, &name, &field, strangers, window);
        assert_eq!(
            heard,
            [expected.to_string(), "0".to_string()],
            "{strangers} strangers, window {window}"
        );
        // A turn that yields first lasts 2 ms past the window.
        let longest = if expected == turn { 10 } else { 12 };
        let turn_ttl: i64 = s.cmd(&["PTTL", &redis_rlock::protocol::turn_key(&name)]);
        assert!(
            (1..=longest).contains(&turn_ttl),
            "the turn's window: {turn_ttl}"
        );
    }
}

/// `acquire.lua` as a waiting call of `field` sends it with turns on, its client in
/// line with no other waiter (`l`), and its answer.
fn acquire_in_line(s: &RedisServer, name: &str, field: &str, window: u64) -> redis::Value {
    let mut p = redis::pipe();
    acquire_cmd(&mut p, name, field, window);
    let (answer,): (redis::Value,) = p.query(&mut s.conn()).unwrap();
    answer
}

/// Adds the call of [`acquire_in_line`] to `p`.
fn acquire_cmd(p: &mut redis::Pipeline, name: &str, field: &str, window: u64) {
    p.cmd("EVAL")
        .arg(redis_rlock::protocol::script_source("acquire.lua").unwrap())
        .arg(4)
        .arg(name)
        .arg(format!("redisson_unlock_latch:{{{name}}}:a1"))
        .arg(redis_rlock::protocol::clients_key(name))
        .arg(redis_rlock::protocol::turn_key(name))
        .arg(30_000)
        .arg(field)
        .arg(10_000)
        .arg(window)
        .arg("fwl");
}

/// The yield is Redis's, not only the client's: an acquire of the client whose turn
/// yields first, sent within that first millisecond (its waiter woken by the end of the
/// turn before, or a new call, at the moment of the release, before the turn message
/// reached its client), is answered busy for what is left of it, while a Redisson waiter
/// woken by the same release takes the free lock. Without it, the turn's client took the
/// lock first in 2 of 4 of the longest waits of a Redisson `lock()` waiter against 2
/// clients x 2 tasks (17-19 ms; 9-14 ms with it, `redisson_peers`).
#[test]
fn a_turn_that_yields_first_is_refused_to_its_own_client_until_the_window_is_left() {
    let s = RedisServer::start();
    let (a, b) = (A, B);
    let window = 50;
    for (strangers, yields) in [(2, true), (0, false)] {
        let name = format!("yield-refused:{strangers}");
        let field = held_with_line(&s, &name, a, b);
        let turn_key = redis_rlock::protocol::turn_key(&name);
        let _ = release_heard(&s, &name, &field, strangers, window);
        let turn_ttl: i64 = s.cmd(&["PTTL", &turn_key]);
        // A yielding turn lasts YIELD_MS (2) past the window, read maybe in its first ms.
        let longest = if yields { window + 2 } else { window };
        assert!(turn_ttl <= longest, "the turn's length: {turn_ttl}");
        let answer = if yields {
            // The turn set afresh in one transaction with the acquire, which Redis runs
            // at one time: the release's first millisecond, which a take on another
            // connection would often miss.
            let mut p = redis::pipe();
            p.atomic()
                .cmd("PEXPIRE")
                .arg(&turn_key)
                .arg(window + 2)
                .ignore();
            acquire_cmd(&mut p, &name, &format!("{b}:1"), window as u64);
            let (answer,): (redis::Value,) = p.query(&mut s.conn()).unwrap();
            answer
        } else {
            acquire_in_line(&s, &name, &format!("{b}:1"), window as u64)
        };
        if !yields {
            // No stranger: the turn is the window, and its client takes the lock.
            assert_eq!(answer, redis::Value::Nil, "taken in its turn");
            continue;
        }
        let redis::Value::Array(items) = answer else {
            panic!("the turn's client was answered {answer:?} in the yield");
        };
        let left = match items.as_slice() {
            [redis::Value::Int(0), redis::Value::Int(left), redis::Value::Int(1)] => *left,
            other => panic!("answered {other:?}"),
        };
        assert!(
            (1..=2).contains(&left),
            "busy for the yield's rest: {left} ms"
        );
        // A Redisson waiter takes the free lock meanwhile.
        let redisson: Option<i64> = redis::Script::new(common::redisson_rlock::ACQUIRE)
            .key(&name)
            .arg(30_000)
            .arg("d1b0f1a4-7c2e-4b8a-9f3d-5e6a7b8c9d0e:7")
            .invoke(&mut s.conn())
            .unwrap();
        assert_eq!(redisson, None, "the Redisson waiter takes the lock");
        let _: () = s.cmd(&["DEL", &name]);
        // Once no more than the window is left, the turn is its client's.
        let _: () = s.cmd(&["PEXPIRE", &turn_key, &(window - 5).to_string()]);
        let answer = acquire_in_line(&s, &name, &format!("{b}:1"), window as u64);
        assert_eq!(answer, redis::Value::Nil, "taken once the yield is over");
    }
}
