//! An explicit-state, breadth-first explorer: every enabled action of every reachable
//! state is taken, within the bounds the model sets itself (its clock stops at a time
//! bound, its actors have a finite number of rounds and its faults a budget).
//!
//! Visited states are kept as 128-bit fingerprints (two independent 64-bit hashes of the
//! whole state): a collision would skip a state, at odds near n^2 / 2^129, about 1e-27
//! for a million states. Traces are kept as a parent pointer and the index of the action
//! taken, and rebuilt by replaying those indices from the initial state: `actions` and
//! `step` are deterministic, so a replay reaches the same states.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
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
