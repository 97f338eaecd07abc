//! The `rlock` ops binary against a real server: what it lists and shows of locks the
//! library holds, force-unlock waking a waiter at once, and its exit codes.
#![cfg(feature = "cli")]

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::RedisServer;
use redis_rlock::Client;

fn rlock(s: &RedisServer, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlock"))
        .arg("--url")
        .arg(s.url())
        .args(args)
        .output()
        .expect("the rlock binary runs")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_inspect_show_the_holder_its_holds_and_ttl() {
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    let outer = c.lock("cli:orders:1").lock().await.unwrap();
    let fixed = c
        .lock("cli:orders:1")
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let other = c.lock("cli:other").lock().await.unwrap();
    let _: () = s.cmd(&["HSET", "cli:not-a-lock", "a", "1"]);

    let out = rlock(&s, &["list", "cli:orders:*"]);
    assert_eq!(out.status.code(), Some(0));
    let listed = text(&out);
    assert!(listed.contains("cli:orders:1"), "{listed}");
    assert!(listed.contains(outer.holder_field()), "{listed}");
    assert!(listed.contains("holds 2"), "{listed}");
    assert!(
        !listed.contains("cli:other"),
        "the pattern was ignored: {listed}"
    );

    let all = text(&rlock(&s, &["list", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&all).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["cli:orders:1", "cli:other"],
        "a plain hash is no lock"
    );

    let out = rlock(&s, &["inspect", "cli:orders:1", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(&text(&out)).unwrap();
    assert_eq!(v["holders"][0]["field"], outer.holder_field());
    assert_eq!(v["holders"][0]["holds"], 2);
    let ttl = v["ttl_ms"].as_i64().unwrap();
    assert!(ttl > 50_000 && ttl <= 60_000, "ttl {ttl}");
    assert_eq!(v["channel"], "redisson_lock__channel:{cli:orders:1}");

    let out = rlock(&s, &["inspect", "cli:free"]);
    assert_eq!(out.status.code(), Some(1), "a lock not held");
    assert!(text(&out).contains("not held"));
    fixed.unlock().await.unwrap();
    outer.unlock().await.unwrap();
    other.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_wakes_a_waiter_at_once() {
    let s = RedisServer::start();
    let holder = Client::connect(s.url()).await.unwrap();
    let waiter = Client::connect(s.url()).await.unwrap();
    let g = holder
        .lock("cli:stuck")
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let shown = forced_wakes(&s, "cli:stuck", waiter.lock("cli:stuck")).await;
    assert!(shown.contains(g.holder_field()), "{shown}");
    assert_eq!(
        rlock(&s, &["force-unlock", "cli:stuck"]).status.code(),
        Some(1)
    );
    assert!(g.unlock().await.is_err(), "the old guard still held");
}

#[test]
fn bad_arguments_and_an_unreachable_server_have_their_own_codes() {
    let s = RedisServer::start();
    assert_eq!(rlock(&s, &["no-such-command"]).status.code(), Some(2));
    let out = Command::new(env!("CARGO_BIN_EXE_rlock"))
        .args(["--url", "redis://127.0.0.1:1", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach"));
}

/// Runs `rlock` with `args` off the runtime's threads.
async fn rlock_async(s: &RedisServer, args: &[&str]) -> Output {
    let (url, args): (String, Vec<String>) =
        (s.url(), args.iter().map(|a| a.to_string()).collect());
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_rlock"))
            .arg("--url")
            .arg(url)
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// `lock` waits for `name` while `rlock inspect` looks at it (its output is returned)
/// and `rlock force-unlock` frees it: the waiter must get it at once, not at the lease.
async fn forced_wakes(s: &RedisServer, name: &str, lock: redis_rlock::Lock) -> String {
    let waiting = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let shown = text(&rlock_async(s, &["inspect", name]).await);
    let forced = Instant::now();
    let out = rlock_async(s, &["force-unlock", name]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap_or_else(|_| panic!("{name}: the waiter slept on after the force unlock"))
        .unwrap();
    assert!(
        got.duration_since(forced) < Duration::from_secs(3),
        "{name}"
    );
    shown
}

/// A read-write lock and a fair lock are told apart by their keys: `inspect` names the
/// kind and its channel, and `force-unlock` wakes their waiters at once (a read-write
/// lock's on `redisson_rwlock:{NAME}`, a fair lock's first waiter on its own channel),
/// leaving no timeout or queue key behind. A semaphore's key is refused with code 4
/// and left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_knows_read_write_and_fair_locks_and_leaves_other_keys_alone() {
    let s = RedisServer::start();
    let holder = Client::connect(s.url()).await.unwrap();
    let waiter = Client::connect(s.url()).await.unwrap();

    let w = holder
        .read_write_lock("cli:rw")
        .write()
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let shown = forced_wakes(&s, "cli:rw", waiter.read_write_lock("cli:rw").read()).await;
    assert!(shown.contains("read-write lock"), "{shown}");
    assert!(shown.contains("redisson_rwlock:{cli:rw}"), "{shown}");
    drop(w);

    let f = holder
        .fair_lock("cli:fair")
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let shown = forced_wakes(&s, "cli:fair", waiter.fair_lock("cli:fair")).await;
    assert!(shown.contains("fair lock"), "{shown}");
    assert!(shown.contains("queue"), "{shown}");
    drop(f);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let left: Vec<String> = s.cmd(&["KEYS", "*cli:*"]);
    assert!(left.is_empty(), "left behind: {left:?}");

    let _: () = s.cmd(&["SET", "cli:sem", "3"]);
    let out = rlock_async(&s, &["inspect", "cli:sem"]).await;
    assert_eq!(out.status.code(), Some(4));
    let out = rlock_async(&s, &["force-unlock", "cli:sem"]).await;
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(s.cmd::<String>(&["GET", "cli:sem"]), "3");
}

/// On a cluster (`--cluster host:port`): `list` finds locks on every master, `inspect`
/// asks the master of the name's slot, and `force-unlock` wakes a waiter that listens
/// through sharded pub/sub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_works_on_a_cluster() {
    let topo = tokio::task::spawn_blocking(common::topology::ClusterTopology::start)
        .await
        .unwrap();
    let build = || async {
        Client::cluster(&topo.urls())
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap()
    };
    let (holder, waiter) = (build().await, build().await);
    let seed = topo.urls()[0].trim_start_matches("redis://").to_string();
    let run = |args: Vec<String>| {
        let seed = seed.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_rlock"))
                .args(["--cluster", &seed])
                .args(args)
                .output()
                .unwrap()
        })
    };
    // Names on different masters.
    let names = ["{c1}:job", "{c2}:job", "{c3}:job"];
    let mut guards = Vec::new();
    for n in names {
        guards.push(
            holder
                .lock(n)
                .lock_with_lease(Duration::from_secs(60))
                .await
                .unwrap(),
        );
    }
    let out = run(vec!["list".into()]).await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for n in names {
        assert!(text(&out).contains(n), "{n} not listed: {}", text(&out));
    }
    let out = run(vec!["inspect".into(), names[1].into()]).await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out).contains(guards[1].holder_field()),
        "{}",
        text(&out)
    );

    let lock = waiter.lock(names[2]);
    let waiting = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let forced = Instant::now();
    let out = run(vec!["force-unlock".into(), names[2].into()])
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter slept on after the force unlock")
        .unwrap();
    assert!(got.duration_since(forced) < Duration::from_secs(3));
}
