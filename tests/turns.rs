//! Turns: clients that wait for a busy lock line up in Redis, and a published release
//! keeps the lock for the client first in line for the turn window (`docs/protocol.md`
//! 2.6). A client that stopped waiting leaves the line. Fair shares, cost and the yield
//! to a stranger under contention: `tests/turns_shares.rs`.

mod common;

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
