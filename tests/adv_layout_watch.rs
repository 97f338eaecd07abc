//! Adversarial review of the 5-name layout, continued (`tests/adv_layout.rs`): `rlock
//! watch` reads the force unlock's event and the turn messages off the lock's own
//! channel now.
#![cfg(feature = "cli")]

mod cli_common;
mod common;

use std::time::Duration;

use cli_common::rlock_async;
use common::RedisServer;
use redis_rlock::Client;

fn events(out: &std::process::Output) -> Vec<(String, String)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, '\t');
            let (_, event, detail) = (parts.next()?, parts.next()?, parts.next()?);
            Some((event.to_string(), detail.to_string()))
        })
        .filter(|(e, _)| e != "subscribers" && e != "renewed" && e != "holds" && e != "state")
        .collect()
}

/// A release that gives another client the turn (its turn message, then `0`) is told as
/// a release or hand-over, never as a force unlock; a force unlock later (its event,
/// then `0`) is told as one, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_tells_a_turn_from_a_force_unlock() {
    let s = RedisServer::start();
    let (a, b) = (
        Client::connect(s.url()).await.unwrap(),
        Client::connect(s.url()).await.unwrap(),
    );
    let name = "w:turn";
    let held = a.lock(name).lock().await.unwrap();
    let a_field = held.holder_field().to_string();
    let taken = tokio::spawn({
        let l = b.lock(name);
        async move { l.lock().await.unwrap() }
    });
    let line = redis_rlock::protocol::clients_key(name);
    assert!(
        common::eventually(Duration::from_secs(5), || s
            .cmd::<Vec<String>>(&["LRANGE", &line, "0", "-1"])
            == [b.id()])
        .await
    );
    let watching = tokio::spawn(rlock_async(s.url(), &["watch", "w:turn", "--for", "3"]));
    tokio::time::sleep(Duration::from_millis(700)).await;
    held.unlock().await.unwrap();
    let b_guard = tokio::time::timeout(Duration::from_secs(5), taken)
        .await
        .unwrap()
        .unwrap();
    let b_field = b_guard.holder_field().to_string();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(a.lock(name).force_unlock().await.unwrap());
    let out = watching.await.unwrap();
    let seen = events(&out);
    let forced: Vec<_> = seen.iter().filter(|(e, _)| e == "force-unlock").collect();
    assert_eq!(forced.len(), 1, "{seen:#?}");
    assert!(forced[0].1.contains(&b_field), "{seen:#?}");
    let first = seen
        .iter()
        .find(|(_, d)| d.contains(&a_field))
        .expect("a's release told");
    assert!(
        first.0 == "handover" || first.0 == "released",
        "a's release told as {first:?}: {seen:#?}"
    );
    drop(b_guard);
}
