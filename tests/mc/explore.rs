//! An explicit-state explorer (breadth-first, depth-first, or depth-first on threads): every enabled action of every reachable
//! state is taken, within the bounds the model sets itself (its clock stops at a time
//! bound, its actors have a finite number of rounds and its faults a budget).
//!
//! Visited states are kept as 128-bit fingerprints (two independent 64-bit hashes of the
//! whole state): a collision would skip a state, at odds near n^2 / 2^129, about 1e-27
//! for a million states. Traces are kept as a parent pointer and the index of the action
//! taken, and rebuilt by replaying those indices from the initial state: `actions` and
//! `step` are deterministic, so a replay reaches the same states. Depth-first and
//! two-thread searches visit the same states (`explore_dfs`, `explore_parallel`).
//!
//! # Reductions, and why every verdict stands
//!
//! The checked model (`world::Checked`) is explored through `por::Reduced`, which takes
//! fewer states and transitions. A property is judged on a state, and two step
//! properties are recorded in it when a script run breaks them, so what must hold is:
//! every state of the full model that breaks a property has a state in the reduced
//! search that breaks the same properties. Two arguments give it.
//!
//! 1. **Canonical states (a bisimulation).** After each step the reduced model rewrites
//!    the state (`World::canonical`), only where no later step and no property reads:
//!    a latch no send can carry again (its request was answered, no retry of it is
//!    pending, no late copy of it is on its way; only a send of its own request names
//!    it) is deleted; request numbers in latch names and sleepers' order numbers are
//!    renumbered 1.., keeping equality and order, the only things read of them (the next
//!    fresh number stays larger than every live one); a sleeper that may run now
//!    (woken, or its wake time passed: the clock never goes back) forgets its wake time,
//!    as does a Redisson waiter with a permit or past its time (`enabled` is then true
//!    until its own step, which writes both anew); messages to a client none of whose
//!    tasks can sleep again, or to a Redisson actor that will never wait again, are
//!    dropped (a delivery only wakes sleepers or gives a waiter its permit); a crashed
//!    client, which takes no step and counts for no property, has its tasks cleared. A
//!    state and its rewrite enable the same actions, whose results are again each
//!    other's rewrites, and break the same properties (`props` reads phases, holds,
//!    bypass counts, and the lock's, line's and turn's keys, none of them rewritten but
//!    a crashed client's tasks, which `props` skips). So the rewritten graph is the
//!    full one with equal states merged.
//! 2. **Idle deliveries (a simulation; the partial-order step).** A delivery whose only
//!    effect is one message fewer (the client's sleepers are all woken, the Redisson
//!    waiter holds a permit already), and every lost message, are not taken. Such a
//!    step goes from s to a state t that equals s but for one message on its way (and,
//!    for a loss, one fewer to lose). Every sequence of actions enabled in t is enabled
//!    in s (nothing ever waits for a message to be delivered, and a larger fault budget
//!    only enables more), and reaches from s the same states but for that one message,
//!    never delivered, and the budget: which no property reads. The message stays on
//!    its way, and its delivery is taken at any later state where it wakes someone, so
//!    its interleavings that matter are all kept. By induction on the length of a path
//!    in the full model, each state on it is matched, for every property, by a state
//!    the reduced search visits (a pruned step's target is matched by its source, whose
//!    other actions are all taken). A lost message therefore adds nothing beyond a
//!    message never delivered, which the model already allows; the lost-message configs
//!    are kept as configs of their own, and equal the plain ones.
//!
//! `reduced_search_keeps_every_verdict` in `tests/model_check.rs` compares the reduced
//! and the full search on the small configs and the seeded bugs: the same properties
//! broken, the reduced search never bigger.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A finite transition system with properties judged on every state it reaches.
pub trait Model {
    type State: Clone + Hash;
    type Action: std::fmt::Debug;

    fn init(&self) -> Self::State;
    /// Every action enabled in `s`, in a deterministic order.
    fn actions(&self, s: &Self::State) -> Vec<Self::Action>;
    /// The state after `a`, and a line that says what happened (for traces).
    fn step(&self, s: &Self::State, a: &Self::Action) -> (Self::State, String);
    /// The properties `s` breaks (their names); checked on every state reached.
    fn violations(&self, s: &Self::State) -> Vec<&'static str>;
    /// What a trace shows of its last state.
    fn describe(&self, s: &Self::State) -> String;
    /// The state's identity for "seen before": by default its own fingerprint; a model
    /// with symmetric actors gives one fingerprint to every state that differs from
    /// another only by a renaming of them (symmetry reduction).
    fn fingerprint(&self, s: &Self::State) -> u128 {
        fingerprint(s)
    }
}

/// The first counterexample found for a property: the shortest, as BFS goes by depth.
#[derive(Clone, Debug)]
pub struct Counterexample {
    pub property: &'static str,
    /// What each step did, from the initial state to the state that breaks it.
    pub trace: Vec<String>,
}

#[derive(Debug)]
pub struct Report {
    pub states: usize,
    pub transitions: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    pub found: Vec<Counterexample>,
}

impl Report {
    pub fn found(&self, property: &str) -> Option<&Counterexample> {
        self.found.iter().find(|c| c.property == property)
    }

    /// The properties broken, sorted.
    pub fn broken(&self) -> Vec<&'static str> {
        let mut b: Vec<&'static str> = self.found.iter().map(|c| c.property).collect();
        b.sort();
        b
    }

    /// Prints every counterexample's trace.
    pub fn print_traces(&self) {
        for c in &self.found {
            let steps = c.trace.len() - 1;
            println!("  counterexample for '{}' ({steps} steps):", c.property);
            for line in &c.trace {
                println!("    {line}");
            }
        }
    }

    pub fn summary(&self, name: &str) -> String {
        let props: Vec<&str> = self.found.iter().map(|c| c.property).collect();
        format!(
            "{name}: {} states, {} transitions, depth {}, {:.2?}; broken: {props:?}",
            self.states, self.transitions, self.max_depth, self.elapsed
        )
    }
}

pub fn fingerprint<S: Hash>(s: &S) -> u128 {
    let mut a = DefaultHasher::new();
    s.hash(&mut a);
    let mut b = DefaultHasher::new();
    0x9e37_79b9_7f4a_7c15u64.hash(&mut b);
    s.hash(&mut b);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

/// Explores every state reachable from `model.init()`. Stops early only if `limit`
/// states are exceeded (then it panics: a config must fit, or it proves nothing).
pub fn explore<M: Model>(model: &M, limit: usize) -> Report {
    let started = Instant::now();
    let init = model.init();
    // Per state index: its parent's index and the action index that led to it.
    let mut parents: Vec<(u32, u16)> = vec![(u32::MAX, 0)];
    let mut depth_of: Vec<u16> = vec![0];
    let mut seen: HashSet<u128> = HashSet::new();
    seen.insert(model.fingerprint(&init));
    let mut queue = VecDeque::from([(init, 0u32)]);
    let mut found: Vec<Counterexample> = Vec::new();
    let mut transitions = 0;
    let check = |s: &M::State, idx: u32, parents: &[(u32, u16)], found: &mut Vec<_>| {
        for p in model.violations(s) {
            if !found.iter().any(|c: &Counterexample| c.property == p) {
                let trace = replay(model, parents, idx);
                found.push(Counterexample { property: p, trace });
            }
        }
    };
    check(&queue[0].0, 0, &parents, &mut found);
    while let Some((s, idx)) = queue.pop_front() {
        for (i, a) in model.actions(&s).iter().enumerate() {
            transitions += 1;
            let (next, _) = model.step(&s, a);
            let fp = model.fingerprint(&next);
            if !seen.insert(fp) {
                continue;
            }
            let n = parents.len() as u32;
            parents.push((idx, i as u16));
            depth_of.push(depth_of[idx as usize] + 1);
            assert!(parents.len() <= limit, "more than {limit} states");
            check(&next, n, &parents, &mut found);
            queue.push_back((next, n));
        }
    }
    Report {
        states: parents.len(),
        transitions,
        max_depth: depth_of.iter().copied().max().unwrap_or(0) as usize,
        elapsed: started.elapsed(),
        found,
    }
}

/// Depth-first, for configs whose frontier would not fit in memory breadth-first: only
/// the path is kept, beside the fingerprints of the states seen (16 bytes each). Every
/// reachable state is still visited once (a state is skipped only when its fingerprint
/// was seen, and the bounds keep the graph finite); a counterexample is the path that
/// found it, not the shortest.
pub fn explore_dfs<M: Model>(model: &M, limit: usize) -> Report {
    let started = Instant::now();
    let init = model.init();
    let mut seen: HashSet<u128> = HashSet::new();
    seen.insert(model.fingerprint(&init));
    let mut found: Vec<Counterexample> = Vec::new();
    let mut transitions = 0;
    let mut max_depth = 0;
    let check = |s: &M::State, path: &[u16], found: &mut Vec<Counterexample>| {
        for p in model.violations(s) {
            if !found.iter().any(|c| c.property == p) {
                let trace = replay_path(model, path);
                found.push(Counterexample { property: p, trace });
            }
        }
    };
    check(&init, &[], &mut found);
    let first = model.actions(&init);
    // Per level: the state, its actions and the next one to take.
    let mut stack = vec![(init, first, 0usize)];
    let mut path: Vec<u16> = Vec::new();
    while let Some((s, actions, next)) = stack.last_mut() {
        if *next == actions.len() {
            stack.pop();
            path.pop();
            continue;
        }
        let i = *next;
        *next += 1;
        transitions += 1;
        let (state, _) = model.step(s, &actions[i]);
        if !seen.insert(model.fingerprint(&state)) {
            continue;
        }
        assert!(seen.len() <= limit, "more than {limit} states");
        if seen.len().is_multiple_of(1_000_000) {
            eprintln!(
                "explored {} states, {transitions} transitions, depth {}, {:.0?}",
                seen.len(),
                path.len(),
                started.elapsed()
            );
        }
        path.push(i as u16);
        max_depth = max_depth.max(path.len());
        check(&state, &path, &mut found);
        let actions = model.actions(&state);
        stack.push((state, actions, 0));
    }
    Report {
        states: seen.len(),
        transitions,
        max_depth,
        elapsed: started.elapsed(),
        found,
    }
}

/// The steps from the initial state along `path` (action indices), replayed.
fn replay_path<M: Model>(model: &M, path: &[u16]) -> Vec<String> {
    let mut s = model.init();
    let mut lines = Vec::new();
    for &i in path {
        let a = &model.actions(&s)[i as usize];
        let (next, line) = model.step(&s, a);
        lines.push(line);
        s = next;
    }
    lines.push(format!("final state: {}", model.describe(&s)));
    lines
}

/// The steps from the initial state to state `idx`, replayed by their action indices.
fn replay<M: Model>(model: &M, parents: &[(u32, u16)], idx: u32) -> Vec<String> {
    let mut path = Vec::new();
    let mut at = idx;
    while at != 0 {
        let (parent, action) = parents[at as usize];
        path.push(action);
        at = parent;
    }
    path.reverse();
    replay_path(model, &path)
}

/// Depth-first on `threads` threads, each with a model of its own from `make` (a model
/// may hold what cannot cross threads: the embedded Lua, `Rc`s). A breadth-first start
/// on this thread splits the graph at a frontier; the threads then take its states one
/// at a time and search depth-first from each, sharing the fingerprints seen. Every
/// reachable state is still visited once: whichever thread inserts its fingerprint
/// first takes all its actions.
pub fn explore_parallel<M: Model>(
    make: &(dyn Fn() -> M + Sync),
    threads: usize,
    limit: usize,
) -> Report {
    let started = Instant::now();
    let model = make();
    let seen = Seen::new();
    let mut found: Vec<Counterexample> = Vec::new();
    let note = |model: &M, s: &M::State, path: &[u16], found: &mut Vec<Counterexample>| {
        for p in model.violations(s) {
            if !found.iter().any(|c| c.property == p) {
                let trace = replay_path(model, path);
                found.push(Counterexample { property: p, trace });
            }
        }
    };
    let init = model.init();
    seen.insert(model.fingerprint(&init));
    note(&model, &init, &[], &mut found);
    // The frontier: states with their paths, every one already counted as seen.
    let mut frontier: VecDeque<(M::State, Vec<u16>)> = VecDeque::from([(init, Vec::new())]);
    let mut transitions = 0;
    while frontier.len() < 64 * threads {
        let Some((s, path)) = frontier.pop_front() else {
            break;
        };
        for (i, a) in model.actions(&s).iter().enumerate() {
            transitions += 1;
            let (next, _) = model.step(&s, a);
            if !seen.insert(model.fingerprint(&next)) {
                continue;
            }
            let mut p = path.clone();
            p.push(i as u16);
            note(&model, &next, &p, &mut found);
            frontier.push_back((next, p));
        }
    }
    let paths: Vec<Vec<u16>> = frontier.into_iter().map(|(_, p)| p).collect();
    let next_item = AtomicUsize::new(0);
    let results: Vec<(usize, usize, Vec<Counterexample>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let model = make();
                    let (mut transitions, mut depth, mut found) = (0, 0, Vec::new());
                    loop {
                        let i = next_item.fetch_add(1, Ordering::Relaxed);
                        let Some(path) = paths.get(i) else { break };
                        let (t, d) = dfs_from(&model, path, &seen, limit, started, &mut found);
                        transitions += t;
                        depth = depth.max(d);
                    }
                    (transitions, depth, found)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a worker"))
            .collect()
    });
    let mut max_depth = paths.iter().map(Vec::len).max().unwrap_or(0);
    for (t, d, f) in results {
        transitions += t;
        max_depth = max_depth.max(d);
        for c in f {
            if !found.iter().any(|x| x.property == c.property) {
                found.push(c);
            }
        }
    }
    Report {
        states: seen.len(),
        transitions,
        max_depth,
        elapsed: started.elapsed(),
        found,
    }
}

/// Fingerprints seen, in shards (one lock each) that threads share.
struct Seen {
    shards: Vec<Mutex<HashSet<u128>>>,
    count: AtomicUsize,
}

impl Seen {
    fn new() -> Seen {
        Seen {
            shards: (0..64).map(|_| Mutex::new(HashSet::new())).collect(),
            count: AtomicUsize::new(0),
        }
    }

    /// Whether `fp` is new (then it is seen from now on).
    fn insert(&self, fp: u128) -> bool {
        let shard = &self.shards[(fp as usize) % self.shards.len()];
        let new = shard.lock().expect("a shard").insert(fp);
        if new {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        new
    }

    fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

/// Depth-first from the state at `start` (already seen and judged): its transitions
/// and the deepest path, counted from the initial state.
fn dfs_from<M: Model>(
    model: &M,
    start: &[u16],
    seen: &Seen,
    limit: usize,
    started: Instant,
    found: &mut Vec<Counterexample>,
) -> (usize, usize) {
    let mut s = model.init();
    for &i in start {
        s = model.step(&s, &model.actions(&s)[i as usize]).0;
    }
    let mut path = start.to_vec();
    let (mut transitions, mut max_depth) = (0, path.len());
    let first = model.actions(&s);
    let mut stack = vec![(s, first, 0usize)];
    while let Some((s, actions, next)) = stack.last_mut() {
        if *next == actions.len() {
            stack.pop();
            path.pop();
            continue;
        }
        let i = *next;
        *next += 1;
        transitions += 1;
        let (state, _) = model.step(s, &actions[i]);
        if !seen.insert(model.fingerprint(&state)) {
            continue;
        }
        let n = seen.len();
        assert!(n <= limit, "more than {limit} states");
        if n.is_multiple_of(1_000_000) {
            eprintln!("explored {n} states, {:.0?}", started.elapsed());
        }
        path.push(i as u16);
        max_depth = max_depth.max(path.len());
        for p in model.violations(&state) {
            if !found.iter().any(|c| c.property == p) {
                let trace = replay_path(model, &path);
                found.push(Counterexample { property: p, trace });
            }
        }
        let actions = model.actions(&state);
        stack.push((state, actions, 0));
    }
    (transitions, max_depth)
}
