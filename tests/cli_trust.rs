//! The `rlock` ops tool as an operator on a shared production server needs it: it never
//! touches what is not a lock, it names a holder's client (and says when none is
//! connected), and `watch` tells hand-overs, force unlocks and expiries as such.
#![cfg(feature = "cli")]

mod cli_common;
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use cli_common::{rlock, rlock_async, stderr, stdout};
use common::{tell_parent, ChildProc, RedisServer, CHILD_ENV};
use redis_rlock::Client;

fn hash(s: &RedisServer, key: &str) -> BTreeMap<String, String> {
    s.cmd(&["HGETALL", key])
}

/// Every command refuses a hash that is not a lock with exit 4, and changes nothing.
fn refused_everywhere(s: &RedisServer, key: &str) {
    let before = hash(s, key);
    for cmd in ["inspect", "force-unlock", "watch"] {
        let out = rlock(
            &s.url(),
            &[cmd, key, "--for", "1"][..if cmd == "watch" { 4 } else { 2 }],
        );
        assert_eq!(out.status.code(), Some(4), "{cmd} {key}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("not a lock"),
            "{cmd}: {}",
            stderr(&out)
        );
    }
    let json = stdout(&rlock(&s.url(), &["inspect", key, "--json"]));
    assert!(json.contains("\"lock\":false"), "{json}");
    let listed = stdout(&rlock(&s.url(), &["list"]));
    assert!(!listed.contains(key), "{listed}");
    assert_eq!(hash(s, key), before, "{key} was changed");
}

#[test]
fn an_application_hash_and_a_bare_mode_field_are_left_untouched() {
    let s = RedisServer::start();
    let _: () = s.cmd(&["HSET", "user:1", "name", "alice", "email", "a@x"]);
    refused_everywhere(&s, "user:1");
    let _: () = s.cmd(&["HSET", "doc:1", "mode", "write"]);
    refused_everywhere(&s, "doc:1");
    // A holder field does not make a lock of a hash that also holds other data.
    let field = "cd21d20e-0b8e-4b7e-9b53-2a3f4c5d6e7f:1";
    let _: () = s.cmd(&["HSET", "user:2", field, "1", "name", "bob"]);
    refused_everywhere(&s, "user:2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_that_stops_being_a_lock_after_list_is_not_deleted() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let guard = c
        .lock("acct:7")
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let listed = stdout(&rlock_async(s.url(), &["list"]).await);
    assert!(listed.contains("acct:7"), "{listed}");
    // The application writes its data under the name meanwhile.
    let _: () = s.cmd(&["HSET", "acct:7", "balance", "100"]);
    let out = rlock_async(s.url(), &["force-unlock", "acct:7"]).await;
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let left = hash(&s, "acct:7");
    assert_eq!(left.get("balance").map(String::as_str), Some("100"));
    assert!(left.contains_key(guard.holder_field()));
}

/// Child side: a named client that takes `ops:held` and waits to be killed.
#[test]
fn ops_child() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    let url = std::env::var("RLOCK_URL").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let c = Client::builder(&url).name(role).build().await.unwrap();
        let g = c
            .lock("ops:held")
            .lock_with_lease(Duration::from_secs(60))
            .await
            .unwrap();
        tell_parent(&format!("HELD {}", g.holder_field()));
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_names_the_holders_client_until_its_process_dies() {
    let s = RedisServer::start();
    let mut child = ChildProc::spawn("ops_child", "billing-worker", &[("RLOCK_URL", s.url())]);
    let line = child.expect_line("HELD", Duration::from_secs(30));
    let field = line.trim().trim_start_matches("HELD ").to_string();
    let shown = stdout(&rlock_async(s.url(), &["inspect", "ops:held"]).await);
    assert!(shown.contains(&field), "{shown}");
    assert!(
        shown.contains("client billing-worker at 127.0.0.1:"),
        "{shown}"
    );
    let listed = stdout(&rlock_async(s.url(), &["list"]).await);
    assert!(listed.contains("client billing-worker"), "{listed}");
    let json = stdout(&rlock_async(s.url(), &["inspect", "ops:held", "--json"]).await);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let client = &v["holders"][0]["client"];
    assert_eq!(client["connected"], true, "{json}");
    assert_eq!(client["name"], "billing-worker", "{json}");

    assert!(child.signal("KILL"));
    child.kill();
    let mut shown = String::new();
    for _ in 0..50 {
        shown = stdout(&rlock_async(s.url(), &["inspect", "ops:held"]).await);
        if shown.contains("not connected") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(shown.contains("client not connected"), "{shown}");
    let json = stdout(&rlock_async(s.url(), &["inspect", "ops:held", "--json"]).await);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["holders"][0]["client"]["connected"], false, "{json}");
}

/// `detail` without the " (client NAME at ADDR)" that follows a holder's field.
fn without_clients(detail: &str) -> String {
    let mut rest = detail;
    let mut out = String::new();
    while let Some(at) = rest.find(" (client ") {
        out.push_str(&rest[..at]);
        rest = rest[at..].split_once(')').map_or("", |(_, after)| after);
    }
    out + rest
}

/// The watch's lines that are events, as (event, detail).
fn events(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, '\t');
            let (_, event, detail) = (parts.next()?, parts.next()?, parts.next()?);
            Some((event.to_string(), without_clients(detail)))
        })
        .filter(|(e, _)| e != "subscribers" && e != "renewed" && e != "holds")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_tells_a_handover_a_force_unlock_and_an_expiry() {
    let s = RedisServer::start();
    let (a, b) = (
        Client::connect(s.url()).await.unwrap(),
        Client::connect(s.url()).await.unwrap(),
    );
    let watching = tokio::spawn(rlock_async(s.url(), &["watch", "w:1", "--for", "5"]));
    tokio::time::sleep(Duration::from_millis(700)).await;

    let first = a.lock("w:1").lock().await.unwrap();
    let first_field = first.holder_field().to_string();
    let lock_b = b.lock("w:1");
    let second = tokio::spawn(async move { lock_b.lock().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(400)).await;
    first.unlock().await.unwrap();
    let second = second.await.unwrap();
    let second_field = second.holder_field().to_string();
    tokio::time::sleep(Duration::from_millis(400)).await;

    assert!(a.lock("w:1").force_unlock().await.unwrap());
    drop(second);
    tokio::time::sleep(Duration::from_millis(400)).await;

    // A holder whose lease runs out, written as Redisson writes one.
    let gone = "0f0e0d0c-0b0a-4908-8706-050403020100:9";
    let _: () = s.cmd(&["HSET", "w:1", gone, "1"]);
    let _: () = s.cmd(&["PEXPIRE", "w:1", "600"]);

    let out = watching.await.unwrap();
    let seen = events(&stdout(&out));
    let expected = [
        ("state", "free".to_string()),
        ("acquired", format!("{first_field} holds 1")),
        ("handover", format!("{first_field} -> {second_field}")),
        (
            "force-unlock",
            format!("deleted by force while held by {second_field}"),
        ),
        ("acquired", format!("{gone} holds 1")),
    ];
    let got: Vec<(&str, &str)> = seen.iter().map(|(e, d)| (e.as_str(), d.as_str())).collect();
    let want: Vec<(&str, &str)> = expected.iter().map(|(e, d)| (*e, d.as_str())).collect();
    assert_eq!(got[..want.len()], want[..], "{seen:#?}");
    assert_eq!(got.len(), want.len() + 1, "{seen:#?}");
    let (event, detail) = got[want.len()];
    assert_eq!(event, "expired", "{seen:#?}");
    assert!(detail.starts_with(gone), "{seen:#?}");
}
