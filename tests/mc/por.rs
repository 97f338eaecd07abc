//! State reductions that keep every property's verdict (see `explore.rs` for the
//! argument): after every step the world forgets what no future step and no property
//! can read, and names what it must keep in a canonical way, so that states that differ
//! only there are one state.
//!
//! - A latch no request can send again (its request was answered, no retry of it is
//!   pending and no late copy of it is on its way) is deleted: only a send of its own
//!   request reads a latch.
//! - The request numbers in latch names, and the order numbers of a client's sleepers,
//!   are renumbered 1.. in their order: a name is only ever compared for equality and
//!   must be fresh, an order number only compared for order.
//! - A sleeper that may run now (woken, or its wake time passed) forgets when it would
//!   have woken; a Redisson waiter likewise. Time only moves forward, so it stays
//!   runnable until its own step, which sets both anew.
//! - A time past the clock's bound (a lease's end, a wake time, a poller's next try)
//!   is one time, "never": the clock does not get there, and times are only compared
//!   with the clock.
//! - Messages on their way to someone who will never again read them (a client with no
//!   task that can sleep, a Redisson actor that no longer waits) are dropped.
//! - A crashed client takes no step: its tasks, line count and run are cleared.

use super::client::{Phase, Req};
use super::explore::Model;
use super::redisson;
use super::world::{Action, Checked, Config, World};

/// The (client, request number) of a latch named by the client model: its name ends in
/// `:c<client>n<request>`.
fn latch_of(name: &[u8]) -> Option<(usize, u32)> {
    let at = name.windows(2).rposition(|w| w == b":c")?;
    let tail = std::str::from_utf8(&name[at + 2..]).ok()?;
    let (c, n) = tail.split_once('n')?;
    Some((c.parse().ok()?, n.parse().ok()?))
}

fn is_latch(name: &[u8]) -> bool {
    name.starts_with(b"redisson_acquire_latch:") || name.starts_with(b"redisson_unlock_latch:")
}

/// A Redisson actor's unlock latch: `...:r<actor>`.
fn redisson_latch(name: &[u8]) -> Option<usize> {
    let at = name.windows(2).rposition(|w| w == b":r")?;
    std::str::from_utf8(&name[at + 2..]).ok()?.parse().ok()
}

fn req_keys(req: &Req) -> &[String] {
    match req {
        Req::Acquire { keys, .. } | Req::Release { keys, .. } => keys,
    }
}

fn req_keys_mut(req: &mut Req) -> &mut Vec<String> {
    match req {
        Req::Acquire { keys, .. } | Req::Release { keys, .. } => keys,
    }
}

impl World {
    /// This state with what nothing reads forgotten and its numbers canonical.
    pub(super) fn canonical(&mut self) {
        let now = self.now();
        // The clock stops here: a time past it is never reached, and only ever
        // compared with the clock.
        let end = super::world::EPOCH + self.cfg.time_bound;
        let never = |t: &mut u64| {
            if *t > end {
                *t = u64::MAX;
            }
        };
        for cl in self.clients.iter_mut().filter(|c| c.crashed) {
            for t in &mut cl.tasks {
                t.phase = Phase::Done;
                t.joined = false;
                t.busy_before = false;
            }
            cl.in_line = 0;
            cl.run = Default::default();
            cl.next_seq = 0;
        }
        for cl in self.clients.iter_mut() {
            let mut may_sleep = false;
            for t in &mut cl.tasks {
                match &mut t.phase {
                    Phase::Sleeping { wake, woken, .. } => {
                        if *woken || now >= *wake {
                            (*woken, *wake) = (true, 0);
                        }
                        never(wake);
                        may_sleep = true;
                    }
                    Phase::Idle { .. }
                    | Phase::Retry {
                        req: Req::Acquire { .. },
                        ..
                    } => may_sleep = true,
                    Phase::Holding { rounds, until } => {
                        never(until);
                        may_sleep |= *rounds > 1
                    }
                    Phase::Retry { rounds, .. } => may_sleep |= *rounds > 1,
                    Phase::Done => {}
                }
            }
            if !may_sleep {
                cl.inbox.clear();
            }
            // Sleepers' order numbers, 1.. in their order.
            let mut seqs: Vec<u8> = (cl.tasks.iter())
                .filter_map(|t| match &t.phase {
                    Phase::Sleeping { seq, .. }
                    | Phase::Retry {
                        req: Req::Acquire { seq, .. },
                        ..
                    } => Some(*seq),
                    _ => None,
                })
                .collect();
            seqs.sort_unstable();
            seqs.dedup();
            let rank = |s: u8| seqs.iter().position(|x| *x == s).expect("a live seq") as u8 + 1;
            for t in &mut cl.tasks {
                match &mut t.phase {
                    Phase::Sleeping { seq, .. }
                    | Phase::Retry {
                        req: Req::Acquire { seq, .. },
                        ..
                    } => *seq = rank(*seq),
                    _ => {}
                }
            }
            cl.next_seq = seqs.len() as u8;
        }
        for a in &mut self.redisson {
            match &mut a.phase {
                redisson::Phase::Waiting { until } if a.permit || now >= *until => {
                    *until = 0;
                    a.permit = true;
                }
                redisson::Phase::Waiting { until } => never(until),
                redisson::Phase::Subscribed | redisson::Phase::Start => {}
                redisson::Phase::Polling { at, left } if *at > end => {
                    (*at, *left) = (u64::MAX, 0);
                }
                redisson::Phase::Holding { until } => {
                    never(until);
                    (a.pending, a.permit) = (0, false);
                }
                _ => {
                    a.pending = 0;
                    a.permit = false;
                }
            }
        }
        self.canonical_latches();
    }

    /// Deletes latches no send can read, and renumbers each client's requests.
    fn canonical_latches(&mut self) {
        let mut live: Vec<Vec<u8>> = Vec::new();
        for cl in self.clients.iter().filter(|c| !c.crashed) {
            for t in &cl.tasks {
                if let Phase::Retry { req, .. } = &t.phase {
                    live.extend(req_keys(req).iter().map(|k| k.clone().into_bytes()));
                }
            }
        }
        for copy in &self.late {
            live.extend(copy.keys.iter().map(|k| k.clone().into_bytes()));
        }
        let dead: Vec<Vec<u8>> = (self.store.live())
            .map(|(k, _)| k)
            .filter(|k| is_latch(k) && !live.contains(k))
            .filter(|k| redisson_latch(k).is_none_or(|i| self.redisson[i].done()))
            .cloned()
            .collect();
        for k in &dead {
            self.store.remove(k);
        }
        // Per client: its live request numbers, in order.
        let mut numbers: Vec<Vec<u32>> = vec![Vec::new(); self.clients.len()];
        let keys = (self.store.live().map(|(k, _)| k.clone())).chain(live);
        for k in keys.filter(|k| is_latch(k)) {
            if let Some((c, n)) = latch_of(&k) {
                numbers[c].push(n);
            }
        }
        let mut renamed = false;
        for (c, ns) in numbers.iter_mut().enumerate() {
            ns.sort_unstable();
            ns.dedup();
            renamed |= ns.iter().enumerate().any(|(i, n)| *n != i as u32 + 1);
            self.clients[c].requests = ns.len() as u8;
        }
        if !renamed {
            return;
        }
        let rename = |name: &[u8]| -> Vec<u8> {
            match latch_of(name).filter(|_| is_latch(name)) {
                Some((c, n)) => {
                    let i = numbers[c]
                        .iter()
                        .position(|x| *x == n)
                        .expect("a live latch");
                    let at = name.windows(2).rposition(|w| w == b":c").expect("a latch");
                    let mut out = name[..at].to_vec();
                    out.extend_from_slice(format!(":c{c}n{}", i + 1).as_bytes());
                    out
                }
                None => name.to_vec(),
            }
        };
        let text = |s: &mut String| *s = String::from_utf8(rename(s.as_bytes())).expect("a name");
        self.store = self.store.renamed(&rename);
        for cl in &mut self.clients {
            for t in &mut cl.tasks {
                if let Phase::Retry { req, .. } = &mut t.phase {
                    req_keys_mut(req).iter_mut().for_each(text);
                }
            }
        }
        for copy in &mut self.late {
            copy.keys.iter_mut().for_each(text);
        }
    }
}

/// The world explored with the reductions above: after each step the state is made
/// canonical, and a delivery that changes nothing but the message count is not taken
/// (its successor is simulated by the state it leaves; see `explore.rs`).
pub struct Reduced(pub Checked);

impl Reduced {
    pub fn new(cfg: Config) -> Reduced {
        Reduced(Checked(cfg))
    }
}

impl World {
    /// Whether `a` is a delivery whose only effect is one message fewer (or a lost
    /// message, the same with one fewer left to lose).
    fn idle_delivery(&self, a: &Action) -> bool {
        match *a {
            Action::ToClient(_, true) | Action::ToRedisson(_, true) => true,
            Action::ToClient(c, false) => !self.clients[c]
                .tasks
                .iter()
                .any(|t| matches!(t.phase, Phase::Sleeping { woken: false, .. })),
            Action::ToRedisson(i, false) => self.redisson[i].permit,
            _ => false,
        }
    }
}

impl Model for Reduced {
    type State = World;
    type Action = Action;

    fn init(&self) -> World {
        let mut w = self.0.init();
        w.canonical();
        w
    }

    fn actions(&self, s: &World) -> Vec<Action> {
        let mut all = self.0.actions(s);
        all.retain(|a| !s.idle_delivery(a));
        all
    }

    fn step(&self, s: &World, a: &Action) -> (World, String) {
        let (mut next, line) = self.0.step(s, a);
        next.canonical();
        (next, line)
    }

    fn violations(&self, s: &World) -> Vec<&'static str> {
        self.0.violations(s)
    }

    fn describe(&self, s: &World) -> String {
        self.0.describe(s)
    }

    fn fingerprint(&self, s: &World) -> u128 {
        self.0.fingerprint(s)
    }
}
