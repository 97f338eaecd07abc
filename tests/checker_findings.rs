//! The counterexamples of the model checker (`tests/model_check.rs`), replayed on a real
//! redis-server: the same script calls, with the keys, arguments and flags of the trace
//! (leases in seconds instead of model milliseconds, so that real time does not matter),
//! and the same subscriptions. Each test asserts the bad outcome the checker found, so
//! each passes today; each flips (fails) once its finding is fixed, and is then turned
//! into a test of the fix.

mod common;

use common::RedisServer;
use redis::Value;
use redis_rlock::protocol::{
    channel_name, clients_key, grant_channel, next_key, script_source, token_key, turn_key,
    turns_channel,
};

const LOCK: &str = "lock";

/// Redisson's `RLock` acquire (`RedissonLock.tryLockInnerAsync`), as the checker's
/// Redisson actors send it (`tests/mc/redisson.rs`).
const REDISSON_ACQUIRE: &str = r#"
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
return redis.call('pttl', KEYS[1])
"#;

fn id(c: usize) -> String {
    format!("cccccccc-cccc-4ccc-8ccc-{c:012}")
}

fn field(c: usize, t: usize) -> String {
    format!("{}:{}", id(c), t + 1)
}

fn eval(s: &RedisServer, src: &str, keys: &[String], args: &[String]) -> Value {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(src).arg(keys.len()).arg(keys).arg(args);
    cmd.query(&mut s.conn()).expect("EVAL")
}

/// `acquire.lua` as the checker's client model sends it for client c's task t.
fn acquire(s: &RedisServer, c: usize, t: usize, lease_ms: u64, flags: &str, req: u32) -> Value {
    let keys = vec![
        LOCK.to_string(),
        token_key(LOCK),
        format!("redisson_acquire_latch:{{{LOCK}}}:c{c}n{req}"),
        clients_key(LOCK),
        turn_key(LOCK),
        next_key(LOCK),
    ];
    let args = [&lease_ms.to_string(), &field(c, t), "4000", "2000", flags];
    let src = script_source("acquire.lua").expect("acquire.lua");
    eval(s, src, &keys, &args.map(String::from))
}

/// `unlock.lua` releasing client c's task t's one hold, with no hand-over.
fn unlock(s: &RedisServer, c: usize, t: usize, flags: &str, req: u32) -> Value {
    let keys = vec![
        LOCK.to_string(),
        channel_name(LOCK),
        format!("redisson_unlock_latch:{{{LOCK}}}:c{c}n{req}"),
        token_key(LOCK),
        clients_key(LOCK),
        turn_key(LOCK),
        turns_channel(LOCK),
        next_key(LOCK),
    ];
    let args = ["0", &field(c, t), "4000", "1", "", "0", "2000", flags];
    let src = script_source("unlock.lua").expect("unlock.lua");
    eval(s, src, &keys, &args.map(String::from))
}

/// Client c's subscriptions as the checker has them: the lock's channel, the turns
/// channel and its own grant channel. Kept while the returned connection lives.
fn listen(s: &RedisServer, c: usize) -> redis::Connection {
    let mut conn = s.conn();
    let mut cmd = redis::cmd("SUBSCRIBE");
    cmd.arg(channel_name(LOCK))
        .arg(turns_channel(LOCK))
        .arg(grant_channel(LOCK, &id(c)));
    cmd.exec(&mut conn).expect("SUBSCRIBE");
    conn
}

fn granted(v: &Value) -> bool {
    matches!(v, Value::Array(items) if items.first() == Some(&Value::Int(1)))
}

fn busy(v: &Value) -> bool {
    matches!(v, Value::Array(items) if items.first() == Some(&Value::Int(0)))
}

/// Finding 2 (`keep_naming` in the checker): client 0 holds, client 1's two tasks wait
/// (the second named with `k`: the other still waits), client 0 unlocks with `d`. The
/// direct grant's LPOP empties the line and deletes the key, and its RPUSH makes it anew
/// without a TTL. Flips when the line keeps a TTL after a direct grant.
#[test]
fn finding_2_a_direct_grant_leaves_the_line_without_ttl() {
    let s = RedisServer::start();
    let _c0 = listen(&s, 0);
    let _c1 = listen(&s, 1);
    assert!(granted(&acquire(&s, 0, 0, 3000, "fwd#1", 1)));
    assert!(busy(&acquire(&s, 1, 0, 3000, "fwd#1", 1)));
    assert!(busy(&acquire(&s, 1, 1, 3000, "fwdk#2", 2)));
    assert_eq!(unlock(&s, 0, 0, "d", 2), Value::Int(4), "granted directly");
    let pttl: i64 = s.cmd(&["PTTL", &clients_key(LOCK)]);
    assert_eq!(pttl, -1, "the line has no TTL (finding 2)");
}

/// Finding 4 (`short_join`): a holder with a 6 s lease, a waiter of client 0 with a 6 s
/// lease joins the line (TTL 12 s), then one of client 1 with a 2 s lease: the line's
/// and the namings' TTL drop to 4 s while the lock has 6 s left. Flips when a join no
/// longer shortens them.
#[test]
fn finding_4_a_short_join_cuts_the_places_of_others() {
    let s = RedisServer::start();
    let _c0 = listen(&s, 0);
    let _c1 = listen(&s, 1);
    let holder = [
        "6000".to_string(),
        "aaaaaaaa-aaaa-4aaa-8aaa-000000000000:1".into(),
    ];
    assert_eq!(
        eval(&s, REDISSON_ACQUIRE, &[LOCK.into()], &holder),
        Value::Nil
    );
    assert!(busy(&acquire(&s, 0, 0, 6000, "fwd#1", 1)));
    let line_before: i64 = s.cmd(&["PTTL", &clients_key(LOCK)]);
    assert!(busy(&acquire(&s, 1, 0, 2000, "fwd#1", 1)));
    let line: i64 = s.cmd(&["PTTL", &clients_key(LOCK)]);
    let names: i64 = s.cmd(&["PTTL", &next_key(LOCK)]);
    let lock: i64 = s.cmd(&["PTTL", LOCK]);
    assert!(
        line_before > 11_000,
        "client 0 joined for 12 s: {line_before}"
    );
    assert!(line <= 4000 && names <= 4000, "cut to 4 s: {line}, {names}");
    assert!(lock > 5000, "while the lock has {lock} ms left (finding 4)");
}
