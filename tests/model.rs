//! Model-based test: random sequences of lock, try_lock, unlock, force_unlock and lease
//! expiry over several tasks and names, checked step by step against a reference model.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::RedisServer;
use proptest::prelude::*;
use redis_rlock::{Client, Error, LockGuard};
use tokio::sync::{mpsc, oneshot};

const NAMES: [&str; 2] = ["m:a", "m:b"];
/// Owners 0 and 1 live on client A, owner 2 on client B.
const OWNERS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    /// One attempt; `watchdog` picks the lease mode.
    TryLock {
        owner: usize,
        name: usize,
        watchdog: bool,
    },
    /// `lock()` on a lock the model says the owner can take (never blocks).
    Lock {
        owner: usize,
        name: usize,
    },
    /// Releases the owner's newest guard on the name, if it has one.
    Unlock {
        owner: usize,
        name: usize,
    },
    /// `force_unlock()` through client A.
    ForceUnlock {
        name: usize,
    },
    /// The lease runs out (the key is deleted, as expiry would; nothing is published).
    Expire {
        name: usize,
    },
    HoldCount {
        owner: usize,
        name: usize,
    },
    IsLocked {
        name: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let o = 0..OWNERS;
    let n = 0..NAMES.len();
    prop_oneof![
        4 => (o.clone(), n.clone(), any::<bool>()).prop_map(|(owner, name, watchdog)| Op::TryLock { owner, name, watchdog }),
        2 => (o.clone(), n.clone()).prop_map(|(owner, name)| Op::Lock { owner, name }),
        4 => (o.clone(), n.clone()).prop_map(|(owner, name)| Op::Unlock { owner, name }),
        1 => n.clone().prop_map(|name| Op::ForceUnlock { name }),
        1 => n.clone().prop_map(|name| Op::Expire { name }),
        2 => (o, n.clone()).prop_map(|(owner, name)| Op::HoldCount { owner, name }),
        1 => n.prop_map(|name| Op::IsLocked { name }),
    ]
}

/// What each owner task is asked to do, and what it answers.
enum Cmd {
    TryLock(usize, bool, oneshot::Sender<bool>),
    Lock(usize, oneshot::Sender<()>),
    Unlock(usize, oneshot::Sender<Result<(), String>>),
    HoldCount(usize, oneshot::Sender<u32>),
}

/// One owner: a tokio task that keeps its guards, so its owner id stays the same.
fn spawn_owner(client: Client) -> mpsc::UnboundedSender<Cmd> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Cmd>();
    tokio::spawn(async move {
        let mut guards: HashMap<usize, Vec<LockGuard>> = HashMap::new();
        while let Some(cmd) = rx.recv().await {
            match cmd {
                Cmd::TryLock(n, watchdog, reply) => {
                    let lock = client.lock(NAMES[n]);
                    let g = if watchdog {
                        lock.try_lock().await.unwrap()
                    } else {
                        lock.try_lock_for(Duration::ZERO, Some(Duration::from_secs(60)))
                            .await
                            .unwrap()
                    };
                    let got = g.is_some();
                    guards.entry(n).or_default().extend(g);
                    let _ = reply.send(got);
                }
                Cmd::Lock(n, reply) => {
                    let g =
                        tokio::time::timeout(Duration::from_secs(10), client.lock(NAMES[n]).lock())
                            .await
                            .expect("lock() blocked on a lock the model says is free")
                            .unwrap();
                    guards.entry(n).or_default().push(g);
                    let _ = reply.send(());
                }
                Cmd::Unlock(n, reply) => {
                    let g = guards
                        .get_mut(&n)
                        .and_then(Vec::pop)
                        .expect("model tracks guards");
                    let r = g.unlock().await.map_err(|e| match e {
                        Error::NotHeld { .. } => "not held".to_string(),
                        Error::LeaseLost { .. } => "lost".to_string(),
                        other => format!("{other}"),
                    });
                    let _ = reply.send(r);
                }
                Cmd::HoldCount(n, reply) => {
                    let _ = reply.send(client.lock(NAMES[n]).hold_count().await.unwrap());
                }
            }
        }
    });
    tx
}

#[derive(Clone, Copy)]
struct ModelGuard {
    watchdog: bool,
    /// Marked lost by a force unlock through the owner's own client.
    lost: bool,
}

/// What a client keeps for one owner's watchdog holds of one name (the watchdog slot):
/// while it is live, further watchdog acquisitions re-enter locally without Redis.
#[derive(Default, Clone, Copy)]
struct Slot {
    holds: u32,
    /// How many of the holds were taken in Redis (counted in the hash).
    remote: u32,
}

#[derive(Default)]
struct Model {
    /// What Redis has: name -> (owner, count in the hash)
    holder: HashMap<usize, (usize, u32)>,
    guards: HashMap<(usize, usize), Vec<ModelGuard>>,
    slots: HashMap<(usize, usize), Slot>,
}

impl Model {
    fn local(&self, owner: usize, name: usize) -> bool {
        self.slots.get(&(owner, name)).is_some_and(|s| s.holds > 0)
    }
    fn can_take(&self, owner: usize, name: usize, watchdog: bool) -> bool {
        (watchdog && self.local(owner, name))
            || self.holder.get(&name).is_none_or(|(o, _)| *o == owner)
    }
    fn take(&mut self, owner: usize, name: usize, watchdog: bool) {
        if watchdog && self.local(owner, name) {
            self.slots.get_mut(&(owner, name)).unwrap().holds += 1;
        } else {
            self.holder.entry(name).or_insert((owner, 0)).1 += 1;
            if watchdog {
                let slot = self.slots.entry((owner, name)).or_default();
                slot.holds += 1;
                slot.remote += 1;
            }
        }
        self.guards
            .entry((owner, name))
            .or_default()
            .push(ModelGuard {
                watchdog,
                lost: false,
            });
    }
    /// Gives back `n` holds in Redis, as the unlock script does.
    fn release(&mut self, owner: usize, name: usize, n: u32) -> Result<(), String> {
        match self.holder.get_mut(&name) {
            Some((o, count)) if *o == owner => {
                if *count > n {
                    *count -= n;
                } else {
                    self.holder.remove(&name);
                }
                Ok(())
            }
            _ => Err("not held".to_string()),
        }
    }
    fn hold_count(&self, owner: usize, name: usize) -> u32 {
        match self.holder.get(&name) {
            Some((o, c)) if *o == owner => {
                let s = self.slots.get(&(owner, name)).copied().unwrap_or_default();
                c + (s.holds - s.remote)
            }
            _ => 0,
        }
    }
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let s = RedisServer::start();
    let a = Client::connect(&s.url()).await.unwrap();
    let b = Client::connect(&s.url()).await.unwrap();
    let owners = [
        spawn_owner(a.clone()),
        spawn_owner(a.clone()),
        spawn_owner(b.clone()),
    ];
    let mut m = Model::default();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::TryLock {
                owner,
                name,
                watchdog,
            } => {
                let (tx, rx) = oneshot::channel();
                owners[owner]
                    .send(Cmd::TryLock(name, watchdog, tx))
                    .unwrap();
                let got = rx.await.unwrap();
                prop_assert_eq!(
                    got,
                    m.can_take(owner, name, watchdog),
                    "step {}: {:?}",
                    step,
                    op
                );
                if got {
                    m.take(owner, name, watchdog);
                }
            }
            Op::Lock { owner, name } => {
                if !m.can_take(owner, name, true) {
                    continue;
                }
                let (tx, rx) = oneshot::channel();
                owners[owner].send(Cmd::Lock(name, tx)).unwrap();
                rx.await.unwrap();
                m.take(owner, name, true);
            }
            Op::Unlock { owner, name } => {
                let Some(g) = m.guards.get_mut(&(owner, name)).and_then(Vec::pop) else {
                    continue;
                };
                let (tx, rx) = oneshot::channel();
                owners[owner].send(Cmd::Unlock(name, tx)).unwrap();
                let got = rx.await.unwrap();
                let expected = if g.lost {
                    // The client already knows: nothing is sent, nothing counts down.
                    Err("lost".to_string())
                } else if g.watchdog {
                    let slot = m.slots.get_mut(&(owner, name)).unwrap();
                    slot.holds -= 1;
                    if slot.holds > 0 {
                        // Another watchdog guard remains: released locally.
                        Ok(())
                    } else {
                        let remote = slot.remote;
                        m.slots.remove(&(owner, name));
                        m.release(owner, name, remote)
                    }
                } else {
                    m.release(owner, name, 1)
                };
                prop_assert_eq!(got, expected, "step {}: {:?}", step, op);
            }
            Op::ForceUnlock { name } => {
                let got = a.lock(NAMES[name]).force_unlock().await.unwrap();
                prop_assert_eq!(
                    got,
                    m.holder.remove(&name).is_some(),
                    "step {}: {:?}",
                    step,
                    op
                );
                // Client A forgets its watchdog holds of the name and marks them lost;
                // client B finds out only at its next renewal.
                for owner in 0..2 {
                    m.slots.remove(&(owner, name));
                    for g in m.guards.entry((owner, name)).or_default() {
                        if g.watchdog {
                            g.lost = true;
                        }
                    }
                }
            }
            Op::Expire { name } => {
                let _: i64 = s.cmd(&["DEL", NAMES[name]]);
                m.holder.remove(&name);
            }
            Op::HoldCount { owner, name } => {
                let (tx, rx) = oneshot::channel();
                owners[owner].send(Cmd::HoldCount(name, tx)).unwrap();
                let expected = m.hold_count(owner, name);
                prop_assert_eq!(rx.await.unwrap(), expected, "step {}: {:?}", step, op);
            }
            Op::IsLocked { name } => {
                let got = b.lock(NAMES[name]).is_locked().await.unwrap();
                prop_assert_eq!(got, m.holder.contains_key(&name), "step {}: {:?}", step, op);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn lock_matches_the_reference_model(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run(ops))?;
    }
}
