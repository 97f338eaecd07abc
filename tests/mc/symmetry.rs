//! Symmetry among clients configured alike and among a client's tasks: one renaming per
//! state, sorting them by what they look like, so that states that differ only by which
//! client or task is which are explored once.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use super::client;
use super::world::{client_line_key, World, LOCK};

/// A renaming of the clients (old index -> new) and of each client's tasks.
pub(super) struct Renaming {
    clients: Vec<usize>,
    tasks: Vec<Vec<usize>>,
}

/// Client ids, holder fields and request latches in `b`, renamed.
pub(super) fn rename_bytes(b: &[u8], r: &Renaming) -> Vec<u8> {
    const ID: &[u8] = b"cccccccc-cccc-4ccc-8ccc-";
    let number = |d: &[u8]| -> usize { std::str::from_utf8(d).unwrap().parse().unwrap() };
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(ID) && rest.len() >= 36 {
            let c = number(&rest[24..36]);
            out.extend_from_slice(client::id(r.clients[c]).as_bytes());
            i += 36;
            // A holder field: `<client id>:<task + 1>`.
            let digits = b[i..]
                .iter()
                .skip(1)
                .take_while(|x| x.is_ascii_digit())
                .count();
            if b.get(i) == Some(&b':') && digits > 0 && i + 1 + digits == b.len() {
                let t = number(&b[i + 1..]) - 1;
                out.extend_from_slice(format!(":{}", r.tasks[c][t] + 1).as_bytes());
                i = b.len();
            }
            continue;
        }
        // A request latch's name ends in `:c<client>n<request>`.
        if rest.starts_with(b":c") {
            let digits = rest[2..].iter().take_while(|x| x.is_ascii_digit()).count();
            if digits > 0 && rest.get(2 + digits) == Some(&b'n') {
                let c = r.clients[number(&rest[2..2 + digits])];
                out.extend_from_slice(format!(":c{c}n").as_bytes());
                i += 3 + digits;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// The ranks of `keys`, in sorted order (ties keep their order): old index -> new.
fn ranks<K: Ord>(keys: &[K]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|a, b| keys[*a].cmp(&keys[*b]));
    let mut rank = vec![0; keys.len()];
    for (new, old) in order.into_iter().enumerate() {
        rank[old] = new;
    }
    rank
}

impl World {
    /// The renaming that sorts each client's tasks, then the clients if they are
    /// configured alike, by what they look like (their state and their holds in the store). Two states that are renamings
    /// of each other mostly sort alike; where a tie is broken differently, the states
    /// stay apart (a reduction missed, never two different states merged: a renaming
    /// only ever maps a state to an equivalent one).
    pub(super) fn sorting(&self, clients_alike: bool) -> Renaming {
        let holds = |c: usize, t: usize| {
            let f = client::field(c, t);
            match self.store.entry(LOCK.as_bytes()).map(|e| &e.value) {
                Some(crate::checker::store::Value::Hash(h)) => h.get(f.as_bytes()).cloned(),
                _ => None,
            }
        };
        // Keys are hashes of what an actor looks like: equal looks, equal keys; a
        // collision only ties two keys, and a tie only misses a reduction.
        let hash = |v: &dyn Fn(&mut DefaultHasher)| {
            let mut h = DefaultHasher::new();
            v(&mut h);
            h.finish()
        };
        let task_keys: Vec<Vec<u64>> = (self.clients.iter().enumerate())
            .map(|(c, cl)| {
                (cl.tasks.iter().enumerate())
                    .map(|(t, task)| {
                        hash(&|h| {
                            task.hash(h);
                            holds(c, t).hash(h);
                        })
                    })
                    .collect()
            })
            .collect();
        let tasks: Vec<Vec<usize>> = task_keys.iter().map(|k| ranks(k)).collect();
        let line = match self.store.entry(client_line_key().as_bytes()) {
            Some(crate::checker::store::Entry {
                value: crate::checker::store::Value::List(l),
                ..
            }) => Some(l),
            _ => None,
        };
        let client_keys: Vec<u64> = (self.clients.iter().enumerate())
            .map(|(c, cl)| {
                let mut mine = task_keys[c].clone();
                mine.sort_unstable();
                let id = client::id(c);
                let place = line.and_then(|l| l.iter().position(|x| x.as_slice() == id.as_bytes()));
                hash(&|h| {
                    mine.hash(h);
                    (cl.in_line, cl.crashed, cl.requests, place).hash(h);
                    cl.run.hash(h);
                    cl.inbox.hash(h);
                })
            })
            .collect();
        Renaming {
            clients: match clients_alike {
                true => ranks(&client_keys),
                false => (0..self.clients.len()).collect(),
            },
            tasks,
        }
    }

    /// This world renamed: clients and their tasks in their new places, their ids,
    /// holder fields and request latches in the store, and the bypass counts.
    pub(super) fn renamed(&self, r: &Renaming) -> World {
        let mut clients = self.clients.clone();
        for (c, cl) in self.clients.iter().enumerate() {
            let mut cl = cl.clone();
            cl.idx = r.clients[c];
            for (t, task) in self.clients[c].tasks.iter().enumerate() {
                cl.tasks[r.tasks[c][t]] = task.clone();
            }
            clients[r.clients[c]] = cl;
        }
        let mut passed: Vec<(u8, u8)> = self
            .passed
            .iter()
            .map(|&(who, n)| match who {
                w if w >= 100 => (100 + r.clients[usize::from(w - 100)] as u8, n),
                w => (w, n),
            })
            .collect();
        passed.sort_unstable();
        let mut late: Vec<_> = (self.late.iter())
            .map(|c| c.renamed(&|b| rename_bytes(b, r)))
            .collect();
        late.sort_by(|a, b| (&a.keys, &a.args).cmp(&(&b.keys, &b.args)));
        World {
            store: self.store.renamed(&|b| rename_bytes(b, r)),
            clients,
            passed,
            late,
            ..self.clone()
        }
    }
}
