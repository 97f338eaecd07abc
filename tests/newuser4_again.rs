//! A new user's retry loop (round 4): a task whose `lock()` is cut by a timeout while its
//! client's unlock hands it the lock asks again at once, as the same holder field.
//! Against a real redis-server, the client behind a proxy whose latency keeps the
//! hand-over on its way. Run: `cargo test --test newuser4_again -- --nocapture`

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{eventually, newcomer, RedisServer};
use redis_rlock::{protocol, Client, LockGuard};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The usual retry loop of one task, on `near` (behind `proxy`): its first `lock()` is
/// cut while its client's unlock hands it the lock (as above), and the same task (the
/// same holder field) asks again at once, while the unlocking side gives that grant back.
/// The task's guard and the hold count it then sees.
async fn cut_then_ask_again(near: &Client, proxy: &Proxy, name: &str) -> (LockGuard, u32) {
    proxy.set_latency(Duration::ZERO);
    let held = near.lock(name).lock().await.unwrap();
    let unlock_at = Instant::now() + ms(800);
    let lock = near.lock(name);
    let task = tokio::spawn(async move {
        let cut = tokio::time::timeout_at(unlock_at + ms(60), lock.lock()).await;
        assert!(
            cut.is_err(),
            "the first call is cut before its hand-over arrives"
        );
        let g = tokio::time::timeout(Duration::from_secs(5), lock.lock())
            .await
            .expect("the second call gets the lock")
            .unwrap();
        let count = lock.hold_count().await.unwrap();
        (g, count)
    });
    tokio::time::sleep_until(unlock_at - ms(100)).await;
    proxy.set_latency(ms(150));
    tokio::time::sleep_until(unlock_at).await;
    held.unlock().await.unwrap();
    let out = task.await.unwrap();
    proxy.set_latency(Duration::ZERO);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_asks_again_after_its_cut_lock_gets_one_sound_hold() {
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let near = Client::connect(proxy.url()).await.unwrap();
    let other = Client::connect(s.url()).await.unwrap();
    let name = "nu4:again";

    for round in 0..3 {
        let (g, count) = cut_then_ask_again(&near, &proxy, name).await;
        let field = g.holder_field().to_string();
        let hash: Vec<(String, i64)> = s.cmd(&["HGETALL", name]);
        assert_eq!(
            (count, hash),
            (1, vec![(field.clone(), 1)]),
            "round {round}: one hold, the task's, counted once (the grant it was cut from \
             given back)"
        );
        assert!(!g.is_lost(), "round {round}: the hold is sound");
        assert!(
            other.lock(name).try_lock().await.unwrap().is_none(),
            "round {round}: nobody else gets in while the task holds"
        );
        // Still its own a little later: a late give-back of the cut grant would take it.
        tokio::time::sleep(ms(500)).await;
        assert_eq!(
            s.cmd::<Vec<(String, i64)>>(&["HGETALL", name]),
            vec![(field, 1)],
            "round {round}: the hold outlives the give-back of the grant its task was cut from"
        );
        assert!(!g.is_lost(), "round {round}: and is not lost");
        g.unlock().await.unwrap();
        assert!(
            newcomer::gone_soon(&s, name).await,
            "round {round}: released"
        );
    }
    newcomer::shut_down(&[&near, &other]).await;
    let (_, forever) = newcomer::left_behind(&s, near.id());
    assert_eq!(forever, Vec::<String>::new(), "no key without a TTL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_asks_again_after_its_cut_lock_leaves_no_place_in_line() {
    let s = RedisServer::start();
    let proxy = Proxy::start(s.port).await;
    let near = Client::connect(proxy.url()).await.unwrap();
    let (other, third) = newcomer::connect_two(&s).await;
    let name = "nu4:again-line";
    let line = || -> Vec<String> { s.cmd(&["LRANGE", &protocol::clients_key(name), "0", "-1"]) };

    let (g, _) = cut_then_ask_again(&near, &proxy, name).await;
    // Granted by Redis with nobody else of its client waiting: the client has no
    // business in the line, and its place there would take a turn.
    let out = eventually(ms(500), || !line().contains(&near.id().to_string())).await;
    let in_line = line();
    g.unlock().await.unwrap();
    // What it costs: another client holds, a third waits; the release gives the turn to
    // the first in line, and the third's waiter waits that turn out.
    let held = other.lock(name).lock().await.unwrap();
    let l = third.lock(name);
    let waiter = tokio::spawn(async move {
        let g = l.lock().await.unwrap();
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    });
    tokio::time::sleep(ms(300)).await;
    let before = line();
    let released = Instant::now();
    held.unlock().await.unwrap();
    let served = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the third client's waiter is served")
        .unwrap();
    let after = served.saturating_duration_since(released);
    println!("line {before:?}; the third client's waiter was served {after:?} after the release");
    assert!(
        out,
        "the client of a task granted by Redis, with no other waiter, is still in the \
         line: {in_line:?}; later, with the line {before:?}, another client's waiter was \
         served {after:?} after a release"
    );
    newcomer::shut_down(&[&near, &other, &third]).await;
    newcomer::nothing_left(&s, near.id(), Duration::from_secs(2), "at the end").await;
}
