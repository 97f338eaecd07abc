//! How many Redis names one plain lock costs (issue 24's target: at most 5, each key
//! with a TTL). Every command the server runs, scripts' own included, is read off
//! `MONITOR` while clients of this crate use one name every way they can: contention
//! with turns and hand-overs, `try_lock`, a wait that runs out (the client leaves the
//! line), the watchdog, and a force unlock. The names are counted with request ids cut
//! off the latches.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::RedisServer;
use redis_rlock::Client;

const NAME: &str = "orders:42";

/// Every command `MONITOR` shows, each as its words, until `stop` is set.
fn monitor(s: &RedisServer, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<Vec<String>>> {
    // Bounded: the test stops it, or 120 s pass.
    let limit = Duration::from_secs(120);
    common::monitor::monitor(s, stop, limit, Vec::new(), |seen, line| {
        seen.push(words(line))
    })
}

/// The quoted words of one `MONITOR` line (`+<time> [<db> <client>] "cmd" "arg" ...`).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => word.push(chars.next().unwrap_or('\\')),
                c => word.push(c),
            }
        }
        out.push(word);
    }
    out
}

/// The Redis names a command touches: its keys and channels.
fn names_of(cmd: &[String]) -> Vec<String> {
    let Some(verb) = cmd.first() else {
        return Vec::new();
    };
    let args = &cmd[1..];
    match verb.to_ascii_lowercase().as_str() {
        "evalsha" | "eval" => {
            let n: usize = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(0);
            args.iter().skip(2).take(n).cloned().collect()
        }
        "del" | "exists" | "subscribe" | "unsubscribe" | "ssubscribe" | "sunsubscribe" => {
            args.to_vec()
        }
        "pubsub" => args.iter().skip(1).cloned().collect(),
        "publish" | "spublish" | "get" | "set" | "hget" | "hset" | "hdel" | "hexists"
        | "hincrby" | "hlen" | "hgetall" | "hkeys" | "pexpire" | "pttl" | "incr" | "type"
        | "lpos" | "rpush" | "lpop" | "lrem" | "lindex" | "lrange" | "llen" => {
            args.first().cloned().into_iter().collect()
        }
        _ => Vec::new(),
    }
}

/// A request latch's name without its request id (`<prefix>:{<name>}:<id>`).
fn without_request_id(name: &str) -> String {
    match name.rsplit_once("}:") {
        Some((head, _)) if name.contains("_latch:") => format!("{head}}}:<id>"),
        _ => name.to_string(),
    }
}

/// Every key of the lock now in Redis has a TTL.
fn keys_have_ttls(s: &RedisServer) -> Result<usize, String> {
    let keys: Vec<String> = s.cmd(&["KEYS", &format!("*{NAME}*")]);
    for k in &keys {
        let pttl: i64 = s.cmd(&["PTTL", k]);
        if pttl == -1 {
            return Err(format!("{k} has no TTL"));
        }
    }
    Ok(keys.len())
}

async fn client(s: &RedisServer) -> Client {
    common::turns::client(s, Duration::from_millis(20)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_costs_at_most_five_redis_names_each_key_with_a_ttl() {
    let s = RedisServer::start();
    let clients = [client(&s).await, client(&s).await, client(&s).await];
    let stop = Arc::new(AtomicBool::new(false));
    let seen = monitor(&s, stop.clone());
    let sampled = Arc::new(Mutex::new(Vec::<Result<usize, String>>::new()));

    // Contention: 3 clients x 2 tasks, short holds, so that releases hand over inside a
    // client, give turns across clients and publish.
    let mut tasks = Vec::new();
    for c in &clients {
        for _ in 0..2 {
            let lock = c.lock(NAME);
            tasks.push(tokio::spawn(async move {
                for _ in 0..40 {
                    let g = lock.lock_with_lease(Duration::from_secs(5)).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    g.unlock().await.unwrap();
                }
            }));
        }
    }
    // A try_lock that finds it busy or free, and a wait that runs out in line.
    let probe = {
        let (a, b) = (clients[0].lock(NAME), clients[1].lock(NAME));
        tokio::spawn(async move {
            for _ in 0..20 {
                if let Some(g) = a.try_lock().await.unwrap() {
                    g.unlock().await.unwrap();
                }
                if let Ok(Some(g)) = b.try_lock_for(Duration::from_millis(2), None).await {
                    g.unlock().await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };
    for _ in 0..30 {
        sampled.lock().unwrap().push(keys_have_ttls(&s));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    probe.await.unwrap();

    // The watchdog renews, then a force unlock takes the lock from its holder.
    let watched = clients[2].lock(NAME).lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(clients[0].lock(NAME).force_unlock().await.unwrap());
    drop(watched);
    tokio::time::sleep(Duration::from_millis(400)).await;
    for c in &clients {
        c.shutdown().await.unwrap();
    }
    sampled.lock().unwrap().push(keys_have_ttls(&s));

    stop.store(true, Ordering::SeqCst);
    let seen = seen.join().unwrap();
    let names: BTreeSet<String> = seen
        .iter()
        .flat_map(|cmd| names_of(cmd))
        .filter(|n| n.contains(NAME))
        .map(|n| without_request_id(&n))
        .collect();
    println!("FIGURE names_per_plain_lock {} {names:?}", names.len());
    let expected: BTreeSet<String> = [
        NAME.to_string(),
        format!("redisson_lock__channel:{{{NAME}}}"),
        format!("redisson_unlock_latch:{{{NAME}}}:<id>"),
        format!("redisson_lock_clients:{{{NAME}}}"),
        format!("redisson_lock_turn:{{{NAME}}}"),
    ]
    .into();
    assert!(names.len() <= 5, "{} names: {names:?}", names.len());
    assert_eq!(names, expected);
    let samples = sampled.lock().unwrap().clone();
    for s in &samples {
        assert!(s.is_ok(), "{s:?}");
    }
    assert!(samples.iter().any(|s| matches!(s, Ok(n) if *n > 1)));
    assert_eq!(
        samples.last(),
        Some(&Ok(0)),
        "keys of the name left after the last unlock"
    );
    // The contention did use turns and hand-overs: the line and the turn were written.
    let published_turns = seen.iter().any(|cmd| {
        cmd.first()
            .is_some_and(|v| v.eq_ignore_ascii_case("publish"))
            && cmd.get(2).is_some_and(|m| m.len() > 10)
    });
    assert!(published_turns, "no turn message was published");
}
