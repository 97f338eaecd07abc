//! Second adversarial review of the fixes for issue 24 (handed grants, unanswered
//! releases, adopts of every kind, multi-lock parts). Each test states what it attacks.
//!
//! Run: `cargo test --test review_attacks -- --nocapture`

mod common;

use std::time::Duration;

use common::RedisServer;
use redis_rlock::{Client, MultiLock, OwnerId};

/// A grant handed over to a waiter whose future is not polled yet is counted in the
/// table as `handed`, not as a hold: `Core::drain` skips it, so shutdown neither
/// releases it nor waits for it. `Client::shutdown` promises that after it no lock of the
/// client is left held in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_grant_handed_to_an_unpolled_waiter() {
    let s = RedisServer::start();
    let a = Client::builder(s.url()).build().await.unwrap();
    let name = "adv2:shutdown-handed";
    let lock = a.lock(name);
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            held_tx.send(()).unwrap();
            go_rx.await.unwrap();
            g.unlock().await.unwrap();
        })
    };
    held_rx.await.unwrap();
    // The waiter: polled until it sleeps on the lock, then left unpolled.
    let waiter = lock.lock();
    tokio::pin!(waiter);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut waiter)
            .await
            .is_err(),
        "setup: the waiter got a held lock"
    );
    go_tx.send(()).unwrap();
    holder.await.unwrap();
    let field = format!("{}:{}", a.id(), OwnerId::current());
    let handed = s.cmd::<Option<i64>>(&["HGET", name, &field]);
    assert_eq!(handed, Some(1), "setup: the unlock did not hand over");
    let shut = a.shutdown().await;
    let left = s.cmd::<Option<i64>>(&["HGET", name, &field]);
    let pttl = s.cmd::<i64>(&["PTTL", name]);
    let after = tokio::time::timeout(Duration::from_secs(5), &mut waiter).await;
    println!("shutdown: {shut:?}; the waiter then got {after:?}");
    assert_eq!(
        left, None,
        "shutdown returned {shut:?} with the lock still held by the grant handed to a waiter \
         of this client (count {left:?}, PTTL {pttl} ms): other clients wait for its lease"
    );
}

/// `MultiLock::new` drops a repeated part by (name, client, kind) only: a fenced lock
/// and a plain lock of one name are the same key, and the one given first stays. Given
/// after the plain one, the fenced part is dropped, and the guard's parts carry no
/// fencing token although a fenced lock was asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_keeps_the_fenced_part_of_a_name() {
    let s = RedisServer::start();
    let a = Client::builder(s.url()).build().await.unwrap();
    let name = "adv2:multi-fenced";
    for fenced_first in [true, false] {
        let parts = if fenced_first {
            vec![a.fenced_lock(name), a.lock(name)]
        } else {
            vec![a.lock(name), a.fenced_lock(name)]
        };
        let multi = MultiLock::new(parts).unwrap();
        let g = multi.lock().await.unwrap();
        let tokens: Vec<Option<u64>> = g.parts().iter().map(|p| p.fencing_token()).collect();
        g.unlock().await.unwrap();
        println!("fenced given first: {fenced_first}; the parts' tokens: {tokens:?}");
        assert!(
            tokens.iter().any(Option::is_some),
            "a fenced lock was a part (given {}), yet no part carries a fencing token: {tokens:?}",
            if fenced_first { "first" } else { "second" }
        );
    }
}

/// An unanswered release is sent again before the field's next acquire or release, but
/// a grant handed over to a waiter of the field is taken up without it. Here the record
/// comes from the background release of a grant whose waiter left (every send held back
/// by the proxy), a twin waiter of the same owner is handed the lock later, and the
/// owner's next call resends the old release as a retry: no latch, so it releases the
/// handed hold, and the call takes the lock anew. Two guards, a count of 1: the first
/// unlock frees the lock while the other guard believes it holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_release_resent_after_a_hand_over_frees_the_handed_hold() {
    use common::client_with;
    use common::proxy::Proxy;
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let client = client_with(
        &proxy.url(),
        Duration::from_secs(30),
        Duration::from_millis(200),
    )
    .await;
    let b = Client::builder(s.url()).build().await.unwrap();
    // Redis knows the scripts already, so late copies are not refused as NOSCRIPT.
    let g = client.lock("adv2:warm").lock().await.unwrap();
    g.unlock().await.unwrap();
    s.load_lock_scripts();
    let name = "adv2:resend-after-hand-over";
    OwnerId::scope(async {
        let lock = client.lock(name);
        // Another owner of the client holds the lock.
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
        let holder = {
            let lock = lock.clone();
            tokio::spawn(async move {
                let g = lock.lock().await.unwrap();
                held_tx.send(()).unwrap();
                go_rx.await.unwrap();
                g.unlock().await.unwrap();
            })
        };
        held_rx.await.unwrap();
        // Two waiters of this owner, asleep, then left unpolled.
        let mut w1 = Box::pin(lock.lock());
        let mut w2 = Box::pin(lock.lock());
        for w in [&mut w1, &mut w2] {
            assert!(
                tokio::time::timeout(Duration::from_millis(200), w.as_mut())
                    .await
                    .is_err(),
                "setup: a waiter got a held lock"
            );
        }
        go_tx.send(()).unwrap();
        holder.await.unwrap();
        let field = format!("{}:{}", client.id(), OwnerId::current());
        assert_eq!(
            s.cmd::<Option<i64>>(&["HGET", name, &field]),
            Some(1),
            "setup: no hand-over"
        );
        // The first waiter leaves; the release of its grant gets no answer.
        proxy.stall();
        drop(w1);
        tokio::time::sleep(Duration::from_secs(3)).await;
        proxy.close_stalled_clients();
        assert_eq!(
            s.cmd::<Option<i64>>(&["HGET", name, &field]),
            Some(1),
            "setup: the release got through"
        );
        // The grant runs out (here: is deleted); another owner of the client takes the
        // lock and hands it to the second waiter on unlock.
        s.cmd::<i64>(&["DEL", name]);
        // The client's subscription is back (a release with it in doubt is published).
        let channel = format!("redisson_lock__channel:{{{name}}}");
        let back = common::eventually(Duration::from_secs(10), || s.numsub(&channel) >= 1).await;
        assert!(back, "setup: the subscription did not come back");
        tokio::time::sleep(Duration::from_millis(300)).await;
        // A release past the run's window is published and ends the run; the next one
        // hands over.
        let mut handed = None;
        for _ in 0..3 {
            let lock = lock.clone();
            tokio::spawn(async move {
                for _ in 0..20 {
                    if let Ok(Some(g)) = lock.try_lock().await {
                        g.unlock().await.unwrap();
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                panic!("setup: another owner could not take the free lock");
            })
            .await
            .unwrap();
            handed = s.cmd::<Option<i64>>(&["HGET", name, &field]);
            if handed.is_some() {
                break;
            }
        }
        let second = tokio::time::timeout(Duration::from_secs(5), w2.as_mut())
            .await
            .expect("setup: the second waiter was not handed the lock")
            .unwrap();
        println!("handed to the second waiter: {handed:?}");
        // The owner's next call (a fixed lease: not a local re-entry) resends the record.
        let third = tokio::time::timeout(
            Duration::from_secs(5),
            lock.lock_with_lease(Duration::from_secs(20)),
        )
        .await
        .expect("the next call hangs")
        .unwrap();
        let count = s.cmd::<Option<i64>>(&["HGET", name, &field]);
        println!("two guards of this owner; the field counts {count:?}");
        third.unlock().await.unwrap();
        let taken = b.lock(name).try_lock().await.unwrap();
        let lost = second.is_lost();
        assert!(
            taken.is_none(),
            "another client took the lock while the handed guard holds it (lost: {lost}); \
             with two guards the field counted {count:?}"
        );
        second.unlock().await.unwrap();
    })
    .await;
}

/// The first send of a partial release latches its outcome for the client's latch TTL
/// (four timeouts), a retry for ten minutes; an unanswered release is kept until it is
/// resent, however long that takes. Here the first send runs (its reply comes too late)
/// and every retry is held back; once the first send's latch has run out, the owner's
/// next call resends the record as a retry, which finds no latch and releases again: the
/// hold of the guard still alive is gone, and the call takes the lock anew, two guards
/// on a count of 1. Control: `ADV2_WAIT_MS=300` resends while the latch lives, and the
/// test passes (the field counts 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_partial_release_resent_after_its_latch_ran_out_releases_twice() {
    use common::client_with;
    use common::proxy::Proxy;
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let client = client_with(
        &proxy.url(),
        Duration::from_secs(30),
        Duration::from_millis(200),
    )
    .await;
    let b = Client::builder(s.url()).build().await.unwrap();
    let g = client.lock("adv2:warm").lock().await.unwrap();
    g.unlock().await.unwrap();
    s.load_lock_scripts();
    let name = "adv2:resend-after-latch";
    let lease = Duration::from_secs(20);
    OwnerId::scope(async {
        let lock = client.lock(name);
        let first = lock.lock_with_lease(lease).await.unwrap();
        let second = lock.lock_with_lease(lease).await.unwrap();
        let field = first.holder_field().to_string();
        assert_eq!(s.cmd::<Option<i64>>(&["HGET", name, &field]), Some(2));
        // The first send gets through, slowly; what follows it is held back.
        proxy.set_latency(Duration::from_millis(400));
        let unlock = tokio::spawn(OwnerId::current().run(first.unlock()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        proxy.stall();
        let failed = tokio::time::timeout(Duration::from_secs(10), unlock)
            .await
            .expect("the unlock hangs")
            .unwrap();
        assert!(
            failed.is_err(),
            "setup: the unlock was answered: {failed:?}"
        );
        proxy.set_latency(Duration::ZERO);
        proxy.close_stalled_clients();
        assert_eq!(
            s.cmd::<Option<i64>>(&["HGET", name, &field]),
            Some(1),
            "setup: the first send did not run"
        );
        // The first send's latch runs out (4 x (200 + 500) ms).
        tokio::time::sleep(Duration::from_millis(
            std::env::var("ADV2_WAIT_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(3500),
        ))
        .await;
        let third = tokio::time::timeout(Duration::from_secs(10), lock.lock_with_lease(lease))
            .await
            .expect("the next call hangs")
            .unwrap();
        let count = s.cmd::<Option<i64>>(&["HGET", name, &field]);
        println!("two guards of this owner; the field counts {count:?}");
        third.unlock().await.unwrap();
        let taken = b.lock(name).try_lock().await.unwrap();
        let lost = second.is_lost();
        assert!(
            taken.is_none(),
            "another client took the lock while a guard of this owner holds it (lost: \
             {lost}); with two guards the field counted {count:?}"
        );
        let _ = second.unlock().await;
    })
    .await;
}

/// A waiter told that an unlock offering it the lock failed after it may have run
/// (`Unsure`) adopts: its call is sent as knowing of no hold even with another request
/// of its field in flight (`begin_acquire`'s `in_flight == 0 || adopt`). A twin call of
/// the same owner sent just before it is also fresh; both find the handed hold and adopt
/// it as it is: two guards, each counted as a hold of its own in the table, on a count
/// of 1. The first unlock frees the lock under the other guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopting_waiter_and_a_fresh_twin_both_adopt_one_handed_hold() {
    use common::client_with;
    use common::proxy::Proxy;
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let client = client_with(
        &proxy.url(),
        Duration::from_secs(30),
        Duration::from_millis(1000),
    )
    .await;
    let b = Client::builder(s.url()).build().await.unwrap();
    let g = client.lock("adv2:warm").lock().await.unwrap();
    g.unlock().await.unwrap();
    s.load_lock_scripts();
    let name = "adv2:adopt-twin";
    OwnerId::scope(async {
        let lock = client.lock(name);
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
        let holder = {
            let lock = lock.clone();
            tokio::spawn(async move {
                let g = lock.lock().await.unwrap();
                held_tx.send(()).unwrap();
                go_rx.await.unwrap();
                g.unlock().await
            })
        };
        held_rx.await.unwrap();
        let mut waiter = Box::pin(futures_util::future::maybe_done(lock.lock()));
        let _ = tokio::time::timeout(Duration::from_millis(200), waiter.as_mut()).await;
        assert!(
            waiter.as_mut().output_mut().is_none(),
            "setup: the waiter got a held lock"
        );
        // The unlock's first send hands over, its reply comes too late, and its retries
        // are held back: it fails, and the waiter's offer is settled as unsure.
        proxy.set_latency(Duration::from_millis(800));
        go_tx.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        proxy.stall();
        let unlocked = tokio::time::timeout(Duration::from_secs(10), holder)
            .await
            .expect("the unlock hangs")
            .unwrap();
        assert!(unlocked.is_err(), "setup: the unlock was answered");
        proxy.close_stalled_clients();
        let field = format!("{}:{}", client.id(), OwnerId::current());
        assert_eq!(
            s.cmd::<Option<i64>>(&["HGET", name, &field]),
            Some(1),
            "setup: the unlock did not hand over"
        );
        // A twin call goes first and is in flight (slowly) when the waiter adopts.
        proxy.set_latency(Duration::from_millis(150));
        let mut twin = Box::pin(futures_util::future::maybe_done(lock.lock()));
        // Control: `ADV2_TWIN_DONE=1` lets the twin's call finish first; the waiter then
        // re-enters its hold, and the test passes.
        let twin_ms = if std::env::var_os("ADV2_TWIN_DONE").is_some() {
            3000
        } else {
            30
        };
        let _ = tokio::time::timeout(Duration::from_millis(twin_ms), twin.as_mut()).await;
        let _ = tokio::time::timeout(Duration::from_millis(30), waiter.as_mut()).await;
        tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(twin.as_mut(), waiter.as_mut())
        })
        .await
        .expect("the calls hang");
        let t = twin.as_mut().take_output().expect("the twin is done");
        let w = waiter.as_mut().take_output().expect("the waiter is done");
        proxy.set_latency(Duration::ZERO);
        let (t, w) = (t.unwrap(), w.unwrap());
        let count = s.cmd::<Option<i64>>(&["HGET", name, &field]);
        println!("twin and waiter both hold; the field counts {count:?}");
        t.unlock().await.unwrap();
        let taken = b.lock(name).try_lock().await.unwrap();
        let lost = w.is_lost();
        assert!(
            taken.is_none(),
            "another client took the lock while the waiter's guard holds it (lost: {lost}); \
             with two guards the field counted {count:?}"
        );
        let _ = w.unlock().await;
    })
    .await;
}
