//! Connection names (`docs/protocol.md` 1.6): every connection a client opens says
//! `CLIENT SETNAME <name>:<client uuid>`, so that `CLIENT LIST` maps the uuid of a holder
//! field to the client's connections, on a real redis-server per test.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{eventually, RedisServer, HARNESS_NAME};
use redis_rlock::{Client, Error, ReplicaSync, SyncFailure};

/// The names of the server's connections of `kind` (`normal`, `pubsub`), one per
/// connection, empty for an unnamed one; the harness's own connections left out.
fn names(s: &RedisServer, kind: &str) -> Vec<String> {
    let list: String = s.cmd(&["CLIENT", "LIST", "TYPE", kind]);
    list.lines()
        .map(|l| field(l, "name").to_string())
        .filter(|n| n != HARNESS_NAME)
        .collect()
}

/// The value of `key=` in one line of `CLIENT LIST`.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split(' ')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_default()
}

/// The client uuid of the one holder of `name`, read from Redis (`HGETALL`).
fn holder_uuid(s: &RedisServer, name: &str) -> String {
    let held: HashMap<String, i64> = s.cmd(&["HGETALL", name]);
    assert_eq!(held.len(), 1, "{held:?}");
    let field = held.keys().next().unwrap();
    // The uuid is 36 characters, before `:<owner id>`.
    field[..36].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_carry_the_name_and_the_uuid_of_the_holder_field() {
    let s = RedisServer::start();
    let c = Client::builder(s.url())
        .name("orders-api")
        .build()
        .await
        .unwrap();
    let g = c.lock("cn:held").lock().await.unwrap();
    let uuid = holder_uuid(&s, "cn:held");
    assert_eq!(uuid, c.id());
    let name = format!("orders-api:{uuid}");
    let normal = names(&s, "normal");
    assert!(!normal.is_empty());
    assert!(normal.iter().all(|n| *n == name), "{normal:?}");
    // The format a parser relies on: the uuid is the last 36 characters.
    assert_eq!(&normal[0][normal[0].len() - 36..], uuid);
    g.unlock().await.unwrap();
}

/// The subscriber connection of a single server speaks RESP3 (`docs/protocol.md` 1.4)
/// and is named too; before, redis-rs's RESP2 subscriber sent nothing but subscriptions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_servers_subscriber_connection_is_named() {
    let s = RedisServer::start();
    let c = Client::builder(s.url())
        .name("sub-api")
        .build()
        .await
        .unwrap();
    let lock = c.lock("cn:sub");
    let g = lock.lock().await.unwrap();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
    };
    let opened = eventually(Duration::from_secs(5), || !names(&s, "pubsub").is_empty()).await;
    assert!(opened, "no subscriber connection");
    assert_eq!(names(&s, "pubsub"), vec![format!("sub-api:{}", c.id())]);
    g.unlock().await.unwrap();
    waiter.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_name_is_rlock() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let g = c.lock("cn:default").lock().await.unwrap();
    let uuid = holder_uuid(&s, "cn:default");
    let normal = names(&s, "normal");
    assert_eq!(normal, vec![format!("rlock:{uuid}")]);
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_name_is_refused_at_build() {
    let s = RedisServer::start();
    let long = "n".repeat(65);
    for bad in ["", "with space", "line\nbreak", "ünïcode", long.as_str()] {
        match Client::builder(s.url()).name(bad).build().await {
            Err(Error::InvalidConfig(m)) => assert!(m.contains("client name"), "{bad:?}: {m}"),
            other => panic!("{bad:?}: expected InvalidConfig, got {other:?}"),
        }
    }
    assert!(names(&s, "normal").is_empty(), "a refused build connected");
}

/// `CLIENT KILL` of the client's command connection: the next lock call works, and the
/// new connection is named again before the call returns. `proactive`: redis-rs
/// reconnects by itself (RESP3), which the test waits for, so that no command of the
/// call fails.
async fn killed_and_named_again(s: &RedisServer, url: &str, proactive: bool) {
    let c = Client::builder(url).name("svc").build().await.unwrap();
    let lock = c.lock("cn:killed");
    lock.lock().await.unwrap().unlock().await.unwrap();
    let name = format!("svc:{}", c.id());
    assert_eq!(names(s, "normal"), vec![name.clone()]);
    let killed: i64 = s.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    assert_eq!(killed, 1);
    if proactive {
        let reconnected = || names(s, "normal").len() == 1;
        assert!(eventually(Duration::from_secs(5), reconnected).await);
    }
    let g = lock.lock().await.unwrap();
    assert_eq!(holder_uuid(s, "cn:killed"), c.id());
    assert_eq!(names(s, "normal"), vec![name]);
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_command_connection_is_named_again() {
    let s = RedisServer::start();
    killed_and_named_again(&s, &s.url(), false).await;
}

/// On RESP3, redis-rs reconnects on the disconnect push, before any command fails: the
/// push is what says the connection is new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_resp3_command_connection_is_named_again() {
    let s = RedisServer::start();
    let url = format!("{}?protocol=resp3", s.url());
    killed_and_named_again(&s, &url, true).await;
}

/// A user whose ACL lacks `CLIENT`: the client works, with unnamed connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_setname_leaves_the_client_working() {
    let s = RedisServer::start();
    let _: String = s.cmd(&[
        "ACL", "SETUSER", "noclient", "on", ">pw", "~*", "&*", "+@all", "-client",
    ]);
    let url = s.url().replacen("redis://", "redis://noclient:pw@", 1);
    let c = Client::builder(url).name("svc").build().await.unwrap();
    let g = c.lock("cn:acl").lock().await.unwrap();
    assert_eq!(holder_uuid(&s, "cn:acl"), c.id());
    g.unlock().await.unwrap();
    assert_eq!(names(&s, "normal"), vec![String::new()]);
}

/// Synced writes go on connections of their own (lanes); they are named too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connections_of_synced_writes_are_named() {
    let s = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let r = RedisServer::start_with(&["--replicaof", "127.0.0.1", &s.port.to_string()]);
    // Online at the master (which `ROLE` reports before WAIT is sent), and done loading
    // at the replica (which acknowledges nothing while it loads).
    let online = || {
        s.try_cmd::<String>(&["INFO", "replication"])
            .is_ok_and(|i| i.contains("state=online"))
            && r.try_cmd::<String>(&["INFO", "replication"])
                .is_ok_and(|i| i.contains("master_link_status:up"))
    };
    assert!(eventually(Duration::from_secs(20), online).await);
    let c = Client::builder(s.url())
        .name("synced")
        .replica_sync(ReplicaSync::Wait {
            timeout: Duration::from_secs(1),
            acks: 1,
            on_failure: SyncFailure::Fail,
        })
        .build()
        .await
        .unwrap();
    let g = c.lock("cn:synced").lock().await.unwrap();
    assert!(s.calls("wait") >= 1, "the grant was not synced");
    let normal = names(&s, "normal");
    // The command connection, and the lane the grant and its WAIT went on.
    assert_eq!(normal.len(), 2, "{normal:?}");
    let name = format!("synced:{}", c.id());
    assert!(normal.iter().all(|n| *n == name), "{normal:?}");
    g.unlock().await.unwrap();
}

/// The names of the connections of `s` that are not the deployment's own (sentinels
/// connect to the master as `sentinel-<id>-cmd` and `-pubsub`).
#[cfg(any(feature = "sentinel", feature = "cluster"))]
fn client_names(s: &RedisServer, kind: &str) -> Vec<String> {
    let mut names = names(s, kind);
    names.retain(|n| !n.starts_with("sentinel-"));
    names
}

/// On Sentinel: the master's command connection, the lanes of synced writes (on by
/// default) and the short connections that check the master's role.
#[cfg(feature = "sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_master_connections_are_named() {
    let topo = tokio::task::spawn_blocking(common::topology::SentinelTopology::start)
        .await
        .unwrap();
    let c = Client::sentinel(&topo.sentinel_urls(), &topo.master_name)
        .name("via-sentinel")
        .build()
        .await
        .unwrap();
    let g = c.lock("cn:sentinel").lock().await.unwrap();
    assert_eq!(holder_uuid(&topo.master, "cn:sentinel"), c.id());
    let name = format!("via-sentinel:{}", c.id());
    let normal = client_names(&topo.master, "normal");
    assert!(normal.len() >= 2, "no lane: {normal:?}");
    assert!(normal.iter().all(|n| *n == name), "{normal:?}");
    g.unlock().await.unwrap();
}

/// On a cluster: every node connection the client's cluster connections have when they
/// connect (commands, lanes, pub/sub) at every node.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_node_connections_are_named() {
    let topo = tokio::task::spawn_blocking(common::topology::ClusterTopology::start)
        .await
        .unwrap();
    let c = Client::cluster(&topo.urls())
        .name("cluster-test")
        .build()
        .await
        .unwrap();
    let lock = c.lock("cn:cluster");
    let g = lock.lock().await.unwrap();
    // A waiter of another task opens the pub/sub connection.
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
    };
    let owner = topo.master_of_slot(topo.keyslot("cn:cluster"));
    let owner = topo.nodes.iter().find(|n| n.port == owner).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || !client_names(owner, "pubsub")
            .is_empty())
        .await
    );
    let name = format!("cluster-test:{}", c.id());
    for node in &topo.nodes {
        let all_named = || {
            let (normal, pubsub) = (client_names(node, "normal"), client_names(node, "pubsub"));
            normal.iter().chain(&pubsub).all(|n| *n == name)
        };
        // A connection the cluster client opens at a node lists before its name is set:
        // one of the client's own that is never named stays unnamed for good.
        let named = eventually(Duration::from_secs(2), all_named).await;
        let (normal, pubsub) = (client_names(node, "normal"), client_names(node, "pubsub"));
        eprintln!("{}: normal {normal:?} pubsub {pubsub:?}", node.port);
        assert!(named, "{normal:?} {pubsub:?}");
    }
    assert!(!client_names(owner, "normal").is_empty());
    // The pub/sub connection dropped: its new connection is named again.
    let killed: i64 = owner.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(killed, 1);
    let renamed = || {
        let pubsub = client_names(owner, "pubsub");
        !pubsub.is_empty() && pubsub.iter().all(|n| *n == name)
    };
    assert!(
        eventually(Duration::from_secs(5), renamed).await,
        "{:?}",
        client_names(owner, "pubsub")
    );
    g.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was woken")
        .unwrap();
}
