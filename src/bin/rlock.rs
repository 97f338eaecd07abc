//! `rlock`: look at and repair the locks of a Redis that redis-rlock or Redisson clients
//! share. Built with `--features cli`.
//!
//! ```text
//! rlock --url redis://127.0.0.1:6379 list 'orders:*'
//! rlock inspect orders:42 --json
//! rlock force-unlock orders:42
//! rlock watch orders:42
//! rlock --cluster 127.0.0.1:7000 list            # every master of a cluster
//! ```
//!
//! Exit codes: 0 done, 1 the lock was not there (`force-unlock`, `inspect`), 2 bad
//! arguments, 3 Redis could not be reached or refused a command, 4 the key holds
//! something else than a lock (a semaphore's count, or a hash of application data:
//! nothing is changed).
//!
//! A lock is a hash whose fields are holder fields `<uuid>:<id>` and, for a read-write
//! lock, `mode` (`protocol::is_holder_field`). Its kind is told from its keys: a `mode` field is a read-write lock
//! (its channel is `redisson_rwlock:{NAME}`), a name with a waiting queue
//! (`redisson_lock_queue:{NAME}`) a fair lock, any other lock hash a plain one. Each is
//! force-unlocked the way Redisson's `forceUnlock` of that kind does it.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use redis::aio::MultiplexedConnection;
use redis_rlock::protocol::{queue_key, token_key};
use redis_rlock::Error;

#[path = "rlock/clients.rs"]
mod clients;
#[path = "rlock/nodes.rs"]
mod nodes;
#[path = "rlock/snapshot.rs"]
mod snapshot;
#[path = "rlock/watch.rs"]
mod watch;

use nodes::{cluster_masters, connect, connect_client, slot_master};

use clients::Clients;
use snapshot::{not_a_lock, snapshot, snapshot_json, ttl_text, Kind, Snapshot};

/// Exit code: the key holds something else than a lock.
pub(crate) const NOT_A_LOCK: u8 = 4;

#[derive(Parser)]
#[command(
    name = "rlock",
    version,
    about = "Inspect and repair Redisson-layout locks",
    after_help = "Exit codes: 0 done; 1 no such lock (inspect, force-unlock); 2 bad arguments; \
3 Redis unreachable or refused a command; 4 the key is not a lock (nothing changed)."
)]
struct Cli {
    /// Redis URL (`redis://` or `valkey://`, or `rediss://`/`valkeys://` with the
    /// `tls-rustls` feature). Default:
    /// `$REDIS_URL`, else redis://127.0.0.1:6379.
    #[arg(long, global = true)]
    url: Option<String>,
    /// Sentinel addresses (`host:port`, repeatable); the master named by `--master` is used.
    #[arg(long = "sentinel", global = true)]
    sentinels: Vec<String>,
    /// The master's name at the sentinels.
    #[arg(long, global = true, default_value = "mymaster")]
    master: String,
    /// Cluster nodes (`host:port`, repeatable): `list` scans every master; a name is
    /// looked up at the master that owns its slot.
    #[arg(long = "cluster", global = true)]
    cluster: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Locks whose names match PATTERN (a SCAN pattern; default `*`): holder, holds, TTL.
    List { pattern: Option<String> },
    /// One lock: holders and hold counts, TTL, subscribed waiters, fencing counter, and
    /// the queue of a fair lock.
    Inspect { name: String },
    /// Deletes the lock and publishes its unlock message, so that waiters wake.
    ForceUnlock { name: String },
    /// Prints acquisitions, releases, renewals and waiter counts as they happen, until
    /// interrupted (or for `--for` seconds).
    Watch {
        name: String,
        /// Stop after this many seconds.
        #[arg(long = "for")]
        seconds: Option<u64>,
    },
}

fn fail(code: u8, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("rlock: {msg}");
    ExitCode::from(code)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let url = match &cli.command {
        _ if cli.cluster.is_empty() => resolve_url(&cli).await,
        Command::List { pattern } => {
            let pattern = pattern.as_deref().unwrap_or("*");
            return match list_cluster(&cli.cluster, pattern, cli.json).await {
                Ok(code) => ExitCode::from(code),
                Err(e) => fail(3, e),
            };
        }
        Command::Inspect { name } | Command::ForceUnlock { name } | Command::Watch { name, .. } => {
            slot_master(&cli.cluster, name).await
        }
    };
    let url = match url {
        Ok(u) => u,
        Err(e) => return fail(3, e),
    };
    // A URL that cannot parse is the caller's mistake, not an outage: scripts that retry
    // on 3 must not retry it.
    if let Err(e) = redis::Client::open(url.as_str()) {
        return fail(2, format!("bad URL {}: {e}", redact(&url)));
    }
    let mut conn = match connect(&url).await {
        Ok(c) => c,
        Err(e) => return fail(3, format!("cannot reach {}: {e}", redact(&url))),
    };
    let outcome = match &cli.command {
        Command::List { pattern } => {
            list(&mut conn, pattern.as_deref().unwrap_or("*"), cli.json).await
        }
        Command::Inspect { name } => inspect(&mut conn, name, cli.json).await,
        Command::ForceUnlock { name } => {
            force_unlock(&mut conn, &url, &cli.cluster, name, cli.json).await
        }
        Command::Watch { name, seconds } => {
            watch::watch(&url, &mut conn, name, *seconds, cli.json).await
        }
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(e) => fail(3, e),
    }
}

/// The URL to use: the master the sentinels name, or `--url`, `$REDIS_URL`, the default.
async fn resolve_url(cli: &Cli) -> Result<String, String> {
    let base = cli
        .url
        .clone()
        .or_else(|| std::env::var("REDIS_URL").ok())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_string());
    if cli.sentinels.is_empty() {
        return Ok(base);
    }
    for s in &cli.sentinels {
        let Ok(client) = redis::Client::open(format!("redis://{s}")) else {
            continue;
        };
        let Ok(mut c) = connect_client(&client).await else {
            continue;
        };
        let addr: redis::RedisResult<Option<(String, u16)>> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&cli.master)
            .query_async(&mut c)
            .await;
        if let Ok(Some((host, port))) = addr {
            return Ok(format!("redis://{host}:{port}"));
        }
    }
    Err(format!(
        "no sentinel of {:?} named a master called {:?}",
        cli.sentinels, cli.master
    ))
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_string(),
    }
}

async fn list(conn: &mut MultiplexedConnection, pattern: &str, json: bool) -> Result<u8, String> {
    let rows = lock_rows(conn, pattern).await?;
    print_rows(&rows, json);
    Ok(0)
}

/// `list` on a cluster: every master's locks, in one listing.
async fn list_cluster(nodes: &[String], pattern: &str, json: bool) -> Result<u8, String> {
    let mut rows = Vec::new();
    for (url, _) in cluster_masters(nodes).await? {
        let mut conn = connect(&url)
            .await
            .map_err(|e| format!("cannot reach {url}: {e}"))?;
        rows.extend(lock_rows(&mut conn, pattern).await?);
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    print_rows(&rows, json);
    Ok(0)
}

/// One lock of a listing, with the clients connected to its server.
struct Row {
    name: String,
    snapshot: Snapshot,
    clients: std::rc::Rc<Clients>,
}

/// The lock hashes matching `pattern` that have holders.
async fn lock_rows(conn: &mut MultiplexedConnection, pattern: &str) -> Result<Vec<Row>, String> {
    let mut names = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .arg("TYPE")
            .arg("hash")
            .query_async(conn)
            .await
            .map_err(|e| e.to_string())?;
        names.extend(batch);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    names.sort();
    let clients = std::rc::Rc::new(clients::connected(conn).await);
    let mut rows = Vec::new();
    for name in names {
        let snapshot = snapshot(conn, &name).await.map_err(|e| e.to_string())?;
        if snapshot.is_lock() {
            let clients = clients.clone();
            rows.push(Row {
                name,
                snapshot,
                clients,
            });
        }
    }
    Ok(rows)
}

fn print_rows(rows: &[Row], json: bool) {
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| snapshot_json(&r.name, &r.snapshot, &r.clients))
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return;
    }
    for Row {
        name,
        snapshot: s,
        clients,
    } in rows
    {
        for (field, holds) in &s.holders {
            let mode = s
                .mode
                .as_deref()
                .map(|m| format!(" ({m})"))
                .unwrap_or_default();
            println!(
                "{name}{mode}\t{field}\tholds {holds}\tttl {}\t{}",
                ttl_text(s.ttl_ms),
                clients::describe(clients, field)
            );
        }
    }
}

async fn inspect(conn: &mut MultiplexedConnection, name: &str, json: bool) -> Result<u8, String> {
    let s = snapshot(conn, name).await.map_err(|e| e.to_string())?;
    if let Some(msg) = not_a_lock(name, &s) {
        if json {
            println!(
                "{}",
                serde_json::json!({"name": name, "exists": true, "type": s.key_type, "lock": false})
            );
        } else {
            eprintln!("rlock: {msg}");
        }
        return Ok(NOT_A_LOCK);
    }
    let kind = Kind::of(&s);
    let channel = kind.channel(name);
    let (numsub, token, queue): (Vec<(String, i64)>, Option<i64>, Vec<String>) = redis::pipe()
        .cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(&channel)
        .cmd("GET")
        .arg(token_key(name))
        .ignore_errors()
        .cmd("LRANGE")
        .arg(queue_key(name))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .or_else(|_| Ok::<_, redis::RedisError>((Vec::new(), None, Vec::new())))
        .map_err(|e: redis::RedisError| e.to_string())?;
    let waiters = numsub.first().map_or(0, |(_, n)| *n);
    let clients = clients::connected(conn).await;
    if json {
        let mut v = snapshot_json(name, &s, &clients);
        v["kind"] = kind.label().into();
        v["channel"] = channel.clone().into();
        v["subscribers"] = waiters.into();
        v["fencing_token"] = token.into();
        v["fair_queue"] = queue.clone().into();
        println!("{v}");
    } else {
        println!("lock      {name}");
        println!(
            "kind      {}",
            if s.exists {
                kind.label()
            } else {
                "none (no key)"
            }
        );
        if !s.exists {
            println!("state     not held");
        } else {
            if let Some(m) = &s.mode {
                println!("mode      {m}");
            }
            for (field, holds) in &s.holders {
                println!("holder    {field} (holds {holds})");
                println!("          {}", clients::describe(&clients, field));
            }
            println!("ttl       {}", ttl_text(s.ttl_ms));
        }
        println!("channel   {channel} ({waiters} subscribed clients)");
        if let Some(t) = token {
            println!("fencing   last token {t}");
        }
        for (i, q) in queue.iter().enumerate() {
            println!("queue {i:>3} {q}");
        }
    }
    Ok(if s.exists { 0 } else { 1 })
}

async fn force_unlock(
    conn: &mut MultiplexedConnection,
    url: &str,
    cluster: &[String],
    name: &str,
    json: bool,
) -> Result<u8, String> {
    let s = snapshot(conn, name).await.map_err(|e| e.to_string())?;
    if let Some(msg) = not_a_lock(name, &s) {
        return Ok(refused(name, &msg, json));
    }
    // The library's own force unlock of the lock's kind: it deletes only a lock hash and
    // publishes that kind's message on that kind's channel in the same script, so
    // waiters of any client wake at once (a fair lock's first waiter, on its own).
    // On a cluster, the library's cluster client: it publishes the way the cluster's
    // waiters listen (sharded or not).
    let client = if cluster.is_empty() {
        redis_rlock::Client::connect(url).await
    } else {
        let seeds: Vec<String> = cluster.iter().map(|n| format!("redis://{n}")).collect();
        redis_rlock::Client::cluster(&seeds).build().await
    }
    .map_err(|e| e.to_string())?;
    let lock = match (Kind::of(&s), s.mode.as_deref()) {
        (Kind::ReadWrite, Some("write")) => client.read_write_lock(name).write(),
        (Kind::ReadWrite, _) => client.read_write_lock(name).read(),
        (Kind::Fair, _) => client.fair_lock(name),
        (Kind::Plain, _) => client.lock(name),
    };
    // The script checks the key again before it deletes: it may have stopped being a
    // lock since the snapshot.
    let deleted = lock.force_unlock().await;
    let _ = client.shutdown().await;
    let deleted = match deleted {
        Ok(deleted) => deleted,
        Err(e @ (Error::NotALock { .. } | Error::WrongType { .. })) => {
            return Ok(refused(name, &format!("{name}: {e}"), json));
        }
        Err(e) => return Err(e.to_string()),
    };
    if json {
        println!("{}", serde_json::json!({"name": name, "deleted": deleted}));
    } else if deleted {
        println!("{name}: deleted, waiters woken");
    } else {
        println!("{name}: not held");
    }
    Ok(if deleted { 0 } else { 1 })
}

/// A force unlock refused because the key is no lock: said on stderr, and in JSON too.
fn refused(name: &str, msg: &str, json: bool) -> u8 {
    eprintln!("rlock: {msg}");
    if json {
        let v = serde_json::json!({"name": name, "deleted": false, "lock": false, "error": msg});
        println!("{v}");
    }
    NOT_A_LOCK
}
