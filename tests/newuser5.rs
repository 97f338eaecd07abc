//! A new user (round 5) follows `docs/protocol.md` section 5, "Inspecting a lock by hand",
//! against a real redis-server, with the script texts `protocol::script_source` gives:
//! the commands of the table show the client's hold and waiter as written; the SHA1 that
//! `SCRIPT EXISTS` knows is that of `script_source`'s text (the preludes included), not
//! of the file in `lua/`; and `take.lua` and `release.lua` run by hand with `EVAL` and
//! the keys and arguments of 2.1a and 2.2a take and give back a lock that the client sees,
//! and waits for. Run: `cargo test --test newuser5 -- --nocapture`

mod common;

use std::time::Duration;

use common::RedisServer;
use redis::Value;
use redis_rlock::{protocol, Client};

fn sha1_of(text: &str) -> String {
    redis::Script::new(text).get_hash().to_string()
}

/// `SCRIPT EXISTS` of one SHA1: whether the server has that exact text cached.
fn cached(s: &RedisServer, sha: &str) -> bool {
    let v: Vec<i64> = s.cmd(&["SCRIPT", "EXISTS", sha]);
    v == [1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn section_5_by_hand_with_the_texts_script_source_gives() {
    let s = RedisServer::start();
    let client = Client::connect(s.url()).await.unwrap();
    let name = "nu5:orders";
    let lock = client.lock(name);
    let channel = protocol::channel_name(name);

    // The client takes and gives back a lock; section 5's table then reads as written.
    let g = lock.lock().await.unwrap();
    let field = g.holder_field().to_string();
    let all: Vec<String> = s.cmd(&["HGETALL", name]);
    assert_eq!(
        all,
        [field.clone(), "1".to_string()],
        "HGETALL: field, count"
    );
    assert_eq!(s.cmd::<i64>(&["HGET", name, &field]), 1);
    let pttl: i64 = s.cmd(&["PTTL", name]);
    assert!(
        pttl > 0 && pttl <= 30_000,
        "PTTL under the watchdog: {pttl}"
    );
    assert_eq!(s.cmd::<i64>(&["EXISTS", name]), 1);
    let normal: String = s.cmd(&["CLIENT", "LIST", "TYPE", "normal"]);
    assert!(
        normal.contains(&format!("name=rlock:{}", &field[..36])),
        "CLIENT LIST names the holder's connection: {normal}"
    );

    // Two tasks of one client wait: one subscriber connection, counted once.
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let l = client.lock(name);
            tokio::spawn(async move { l.lock().await.map(|g| g.holder_field().to_string()) })
        })
        .collect();
    assert!(
        common::eventually(Duration::from_secs(5), || s.numsub(&channel) == 1).await,
        "PUBSUB NUMSUB: {}",
        s.numsub(&channel)
    );
    let pubsub: String = s.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]);
    assert_eq!(
        pubsub.lines().count(),
        1,
        "one subscriber connection: {pubsub}"
    );
    g.unlock().await.unwrap();
    for w in waiters {
        let got = tokio::time::timeout(Duration::from_secs(10), w).await;
        // Each waiter gets the lock in turn; its guard drops (released in the background).
        got.expect("a waiter gets the lock").unwrap().unwrap();
    }
    assert!(
        common::eventually(Duration::from_secs(5), || s.cmd::<i64>(&["EXISTS", name])
            == 0)
        .await,
        "dropped guards give the lock back"
    );

    // An uncontended pair: `take.lua` and `release.lua` (2.1a, 2.2a).
    lock.lock().await.unwrap().unlock().await.unwrap();
    // `SCRIPT EXISTS <sha1>`: the uncontended pair's scripts are cached under the SHA1 of
    // the text `script_source` gives, and not under that of the file in lua/, which the
    // server never saw (its `--#include` lines are replaced before hashing).
    for file in ["take.lua", "release.lua"] {
        let sent = protocol::script_source(file).unwrap();
        assert!(
            cached(&s, &sha1_of(sent)),
            "{file}: the text sent is cached"
        );
        let on_disk =
            std::fs::read_to_string(format!("{}/lua/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert!(on_disk.contains("--#include"), "{file} includes a prelude");
        assert!(!cached(&s, &sha1_of(&on_disk)), "{file}: the file is not");
    }

    // take.lua by hand, as 2.1a has it for a single try (KEYS: the name; ARGV: lease,
    // field): a grant answers nil; then the lock is busy to the client, and a second
    // take by hand answers the PTTL.
    let take = protocol::script_source("take.lua").unwrap();
    let mine = "0b2c1a4e-5f60-4e7a-9c3d-2b1a0f9e8d7c:1";
    let mut c = s.conn();
    let granted: Value = redis::cmd("EVAL")
        .arg(take)
        .arg(1)
        .arg(name)
        .arg(20_000)
        .arg(mine)
        .query(&mut c)
        .unwrap();
    assert_eq!(granted, Value::Nil, "take.lua: a grant answers nil");
    assert!(lock.is_locked().await.unwrap());
    assert!(
        lock.try_lock().await.unwrap().is_none(),
        "the client sees the hand-made hold"
    );
    let other = "9d8e7f6a-5b4c-4d3e-8f2a-1b0c9d8e7f6a:7";
    let busy: i64 = redis::cmd("EVAL")
        .arg(take)
        .arg(1)
        .arg(name)
        .arg(20_000)
        .arg(other)
        .query(&mut c)
        .unwrap();
    assert!(busy > 0 && busy <= 20_000, "busy: the PTTL: {busy}");
    // The file alone is not that text: its busy path calls a prelude's function, which
    // the server never saw. A prelude is no script of its own.
    let file =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/take.lua")).unwrap();
    let alone: redis::RedisResult<Value> = redis::cmd("EVAL")
        .arg(&file)
        .arg(1)
        .arg(name)
        .arg(20_000)
        .arg(other)
        .query(&mut c);
    assert!(
        alone.is_err(),
        "lua/take.lua alone on a busy lock: {alone:?}"
    );
    assert_eq!(protocol::script_source("lock_shape.lua"), None);

    // A task of the client waits; release.lua by hand, as 2.2a has it with turns off
    // (KEYS: name, channel, unlock latch; ARGV: field, holds, lease, latch TTL), gives
    // the last hold back, publishes, and the waiter gets in.
    let l = client.lock(name);
    let waiter = tokio::spawn(async move {
        let g = l.lock().await?;
        g.unlock().await
    });
    assert!(
        common::eventually(Duration::from_secs(5), || s.numsub(&channel) == 1).await,
        "the waiter listens"
    );
    let latch = format!("redisson_unlock_latch:{{{name}}}:nu5-by-hand");
    let released: Value = redis::cmd("EVAL")
        .arg(protocol::script_source("release.lua").unwrap())
        .arg(3)
        .arg(name)
        .arg(&channel)
        .arg(&latch)
        .arg(mine)
        .arg(1)
        .arg(0)
        .arg(5_000)
        .query(&mut c)
        .unwrap();
    assert_eq!(
        released,
        Value::Int(1),
        "release.lua: released and published"
    );
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the published release wakes the waiter")
        .unwrap()
        .unwrap();
    assert!(!lock.is_locked().await.unwrap());

    client.shutdown().await.unwrap();
}
