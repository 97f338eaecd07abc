//! The counterexamples of the model checker (`tests/model_check.rs`), replayed on a real
//! redis-server: the same script calls, with the keys, arguments and flags of the trace
//! (leases in seconds instead of model milliseconds, so that real time does not matter),
//! and the same subscriptions. A finding not fixed yet is asserted as the bad outcome the
//! checker found (it flips, failing, once fixed); a fixed one asserts the fix, and failed
//! before it.

mod common;

use common::RedisServer;
use redis::Value;
use redis_rlock::protocol::{channel_name, clients_key, script_source, turn_key};

const LOCK: &str = "lock";

use common::redisson_rlock::{ACQUIRE as REDISSON_ACQUIRE, UNLOCK as REDISSON_UNLOCK};

const REDISSON_FIELD: &str = "aaaaaaaa-aaaa-4aaa-8aaa-000000000000:1";

fn redisson_acquire(s: &RedisServer) -> Value {
    let args = ["3000".to_string(), REDISSON_FIELD.into()];
    eval(s, REDISSON_ACQUIRE, &[LOCK.into()], &args)
}

fn redisson_unlock(s: &RedisServer) -> Value {
    let keys = [
        LOCK.to_string(),
        channel_name(LOCK),
        format!("redisson_unlock_latch:{{{LOCK}}}:r0"),
    ];
    let args = ["0", "3000", REDISSON_FIELD, "publish", "4000"].map(String::from);
    eval(s, REDISSON_UNLOCK, &keys, &args)
}

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
        format!("redisson_unlock_latch:{{{LOCK}}}:acq-c{c}n{req}"),
        clients_key(LOCK),
        turn_key(LOCK),
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
        clients_key(LOCK),
        turn_key(LOCK),
    ];
    let args = ["0", &field(c, t), "4000", "1", "", "0", "2000", flags];
    let src = script_source("unlock.lua").expect("unlock.lua");
    eval(s, src, &keys, &args.map(String::from))
}

/// Client c's subscription as the checker has it: the lock's channel. Kept while the
/// returned connection lives.
fn listen(s: &RedisServer, c: usize) -> redis::Connection {
    let _ = c;
    let mut conn = s.conn();
    let mut cmd = redis::cmd("SUBSCRIBE");
    cmd.arg(channel_name(LOCK));
    cmd.exec(&mut conn).expect("SUBSCRIBE");
    conn
}

fn granted(v: &Value) -> bool {
    // nil: a plain lock's fresh first grant.
    *v == Value::Nil || matches!(v, Value::Array(items) if items.first() == Some(&Value::Int(1)))
}

fn busy(v: &Value) -> bool {
    matches!(v, Value::Array(items) if items.first() == Some(&Value::Int(0)))
}

/// Finding 2 (`keep_naming` in the checker): client 0 holds, client 1's two tasks wait,
/// client 0 unlocks: the published release LPOPs client 1 out of the line, which empties
/// and deletes it; client 1's first task takes the lock on its turn and, its second task
/// still waiting, joins the line again with RPUSH (`k`): the list made anew must get a
/// TTL (found with a direct grant's LPOP and RPUSH, PTTL -1, before the fix).
#[test]
fn finding_2_a_line_made_anew_keeps_expiring() {
    let s = RedisServer::start();
    let _c0 = listen(&s, 0);
    let _c1 = listen(&s, 1);
    assert!(granted(&acquire(&s, 0, 0, 3000, "fw", 1)));
    assert!(busy(&acquire(&s, 1, 0, 3000, "fw", 1)));
    assert!(busy(&acquire(&s, 1, 1, 3000, "fwk", 2)));
    assert_eq!(unlock(&s, 0, 0, "", 2), Value::Int(1), "published");
    let gone: i64 = s.cmd(&["EXISTS", &clients_key(LOCK)]);
    assert_eq!(gone, 0, "client 1 left the line for its turn");
    assert!(granted(&acquire(&s, 1, 0, 3000, "fwk", 3)));
    let pttl: i64 = s.cmd(&["PTTL", &clients_key(LOCK)]);
    assert!(pttl > 0, "the line has no TTL (finding 2): {pttl}");
}

/// Finding 4 (`short_join`): a holder with a 6 s lease, a waiter of client 0 with a 6 s
/// lease joins the line (TTL 12 s), then one of client 1 with a 2 s lease. Before the fix
/// the line's TTL dropped to 4 s while the lock had 6 s left; a join never shortens it
/// now.
#[test]
fn finding_4_a_short_join_keeps_the_places_of_others() {
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
    assert!(busy(&acquire(&s, 0, 0, 6000, "fw", 1)));
    let line_before: i64 = s.cmd(&["PTTL", &clients_key(LOCK)]);
    assert!(busy(&acquire(&s, 1, 0, 2000, "fw", 1)));
    let line: i64 = s.cmd(&["PTTL", &clients_key(LOCK)]);
    let lock: i64 = s.cmd(&["PTTL", LOCK]);
    assert!(
        line_before > 11_000,
        "client 0 joined for 12 s: {line_before}"
    );
    assert!(lock > 5000, "the lock has {lock} ms left");
    assert!(
        line > 11_000,
        "cut by a short join (finding 4): line {line}"
    );
}

/// Finding 1 (`direct_chain`): client 0 holds, a Redisson `tryLock()` poller is
/// answered busy, client 1 waits; client 0's unlock granted client 1 directly, and the
/// lock was never free (every try of the poller busy, passed over by every grant). Fixed
/// by taking direct grants out: the unlock publishes and the lock is free, so the
/// poller's next try gets it. (Client 1's turn keeps this crate's other clients out for
/// the turn window, never a Redisson peer.)
#[test]
fn finding_1_a_release_leaves_the_lock_free_for_a_poller() {
    let s = RedisServer::start();
    let _c0 = listen(&s, 0);
    let _c1 = listen(&s, 1);
    assert!(granted(&acquire(&s, 0, 0, 3000, "fw", 1)));
    assert!(matches!(redisson_acquire(&s), Value::Int(_)), "busy");
    assert!(busy(&acquire(&s, 1, 0, 3000, "fw", 1)));
    assert_eq!(unlock(&s, 0, 0, "", 2), Value::Int(1), "published");
    assert_eq!(redisson_acquire(&s), Value::Nil, "the poller gets in");
}

/// The turn left over (found by the checker, `two_and_waiter`): client 1 is given the
/// turn by client 0's published release, but a Redisson waiter (which ignores turns)
/// takes the lock; client 1's attempt is busy and joins the line again; after the
/// Redisson unlock, client 1 takes the lock on its turn and stays in line (the turn's
/// branch skips the leave of `l`); its own unlock then gives the turn to itself. A turn
/// key named a client that waited for nothing. Fixed: a grant on a turn takes the client
/// out of the line as `l` asks, so its unlock gives no turn to anyone (before the fix the
/// turn went to the client that had just released).
#[test]
fn a_turn_is_never_left_to_a_client_that_waits_for_nothing() {
    let s = RedisServer::start();
    let _c0 = listen(&s, 0);
    let _c1 = listen(&s, 1);
    assert!(granted(&acquire(&s, 0, 0, 3000, "fw", 1)));
    assert!(matches!(redisson_acquire(&s), Value::Int(_)));
    // The Redisson waiter subscribes after its busy answer.
    let mut r0 = s.conn();
    redis::cmd("SUBSCRIBE")
        .arg(channel_name(LOCK))
        .exec(&mut r0)
        .unwrap();
    assert!(busy(&acquire(&s, 1, 0, 3000, "fw", 1)));
    assert_eq!(
        unlock(&s, 0, 0, "", 2),
        Value::Int(1),
        "published, with client 1's turn"
    );
    assert_eq!(redisson_acquire(&s), Value::Nil, "Redisson takes it anyway");
    assert!(busy(&acquire(&s, 1, 0, 3000, "fwl", 2)));
    assert_eq!(redisson_unlock(&s), Value::Int(1));
    // The turn was given while the Redisson waiter listened: Redis keeps it from client 1
    // for its first 1-2 ms (`docs/protocol.md` 2.6).
    std::thread::sleep(std::time::Duration::from_millis(3));
    assert!(granted(&acquire(&s, 1, 0, 3000, "fwl", 3)));
    assert_eq!(unlock(&s, 1, 0, "", 4), Value::Int(1));
    let turn: Option<String> = s.cmd(&["GET", &turn_key(LOCK)]);
    assert_eq!(turn, None, "a turn for the client that just released");
    let line: Vec<String> = s.cmd(&["LRANGE", &clients_key(LOCK), "0", "-1"]);
    assert!(line.is_empty(), "nobody waits: {line:?}");
}
