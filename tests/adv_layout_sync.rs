//! Adversarial review of the 5-name layout, continued (`tests/adv_layout.rs`): a fenced
//! lock's optional last key (the token counter) on the replica-sync undo path, where a
//! grant no replica acknowledged is released again with turns off.

mod common;

use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::protocol::{clients_key, token_key};
use redis_rlock::{Client, ReplicaSync, SyncFailure};

/// A turn used by a fenced waiter whose grant no replica acknowledged: the undo
/// (`unlock.lua` with `F` and the counter as its last key) frees the lock for the next
/// waiter, which gets a higher token; nothing is left held, and every key of the name
/// but Redisson's counter has a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_grant_undone_for_replica_sync_frees_the_lock_with_rising_tokens() {
    let s = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let r = RedisServer::start_with(&["--replicaof", "127.0.0.1", &s.port.to_string()]);
    let online = || {
        s.try_cmd::<String>(&["INFO", "replication"])
            .is_ok_and(|i| i.contains("state=online"))
            && r.try_cmd::<String>(&["INFO", "replication"])
                .is_ok_and(|i| i.contains("master_link_status:up"))
    };
    assert!(common::eventually(Duration::from_secs(20), online).await);
    let plain = || async {
        Client::builder(s.url())
            .turn_window(Duration::from_millis(500))
            .build()
            .await
            .unwrap()
    };
    let (h, w) = (plain().await, plain().await);
    let synced = Client::builder(s.url())
        .turn_window(Duration::from_millis(500))
        .replica_sync(ReplicaSync::Wait {
            timeout: Duration::from_millis(100),
            acks: 1,
            on_failure: SyncFailure::Fail,
        })
        .build()
        .await
        .unwrap();
    let name = "adv:sync-f";
    let held = h.fenced_lock(name).lock().await.unwrap();
    let first = held.fencing_token().unwrap();
    // The replica stops acknowledging: the synced client's grant will be undone.
    r.signal("STOP");
    let undone = tokio::spawn({
        let l = synced.fenced_lock(name);
        async move {
            let g = l.lock().await?;
            let t = g.fencing_token();
            g.unlock().await?;
            Ok::<_, redis_rlock::Error>(t)
        }
    });
    let line = || s.cmd::<Vec<String>>(&["LRANGE", &clients_key(name), "0", "-1"]);
    assert!(common::eventually(Duration::from_secs(5), || line() == [synced.id()]).await);
    let next = tokio::spawn({
        let l = w.fenced_lock(name);
        async move {
            let g = l.lock().await.unwrap();
            let t = (g.fencing_token().unwrap(), Instant::now());
            g.unlock().await.unwrap();
            t
        }
    });
    assert!(common::eventually(Duration::from_secs(5), || line().len() == 2).await);
    let released = Instant::now();
    held.unlock().await.unwrap();
    // The synced waiter takes its turn, its grant is undone (published with no turn), and
    // it rides that out as a transient error while the next waiter takes the lock.
    let (token, at) = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("the next waiter got the lock after the undo")
        .unwrap();
    assert!(!undone.is_finished(), "the synced waiter stopped waiting");
    assert!(s.calls("wait") >= 1, "no WAIT was sent");
    r.signal("CONT");
    let got = tokio::time::timeout(Duration::from_secs(15), undone)
        .await
        .expect("the synced waiter got the lock once the replica was back")
        .unwrap()
        .unwrap();
    assert!(
        got.is_some_and(|t| t > token),
        "tokens {token} then {got:?}"
    );
    println!(
        "FIGURE sync_undo: next waiter granted {:?} after the release",
        at - released
    );
    // The undone grant drew a token too: the next one is above both.
    assert!(token >= first + 2, "tokens {first} then {token}");
    assert!(
        at - released < Duration::from_secs(2),
        "granted {:?} after",
        at - released
    );
    assert_eq!(s.cmd::<i64>(&["EXISTS", name]), 0, "a hold was left");
    let keys: Vec<String> = s.cmd(&["KEYS", "*adv:sync-f*"]);
    for k in keys {
        let ttl: i64 = s.cmd(&["PTTL", &k]);
        assert!(ttl > 0 || k == token_key(name), "{k} has PTTL {ttl}");
    }
}
