mod checker;

#[test]
fn smoke() {
    use checker::store::{Reply, Store};
    let mut s = Store::new(1_000_000);
    let r = checker::script::run(&mut s, "redis.call('hset', KEYS[1], 'a', 1); redis.call('pexpire', KEYS[1], 100); return {redis.call('pttl', KEYS[1]), redis.call('type', KEYS[1]), redis.pcall('get', KEYS[1]), 3.7, true, false, 'x'}", &["k"], &[] as &[&str]);
    println!("{r:?}");
    assert!(matches!(r, Ok(Reply::Array(_))));
}
