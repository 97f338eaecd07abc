//! The checked world: one Redis store on a model clock, Redisson actors, clients of this
//! crate, pub/sub messages on their way, and the faults left to inject. Its actions are
//! the actors' steps, message deliveries, clock ticks and faults; every Redis effect goes
//! through a real script run on the store (`checker::script::run`).

use std::collections::{BTreeSet, VecDeque};
use std::rc::Rc;

use super::client::{self, Client};
use super::explore::Model;
use super::props;
use super::redisson::{self, Actor};
use crate::checker::store::{Reply, Store};

/// The lock's name.
pub const LOCK: &str = "lock";
/// The model clock starts here (ms), so that `TIME` answers a plausible epoch.
pub const EPOCH: u64 = 1_000_000;

/// The script texts the world runs: the real ones, or a seeded bug's edit of them.
#[derive(Clone)]
pub struct Scripts {
    pub acquire: Rc<str>,
    pub take: Rc<str>,
    pub unlock: Rc<str>,
    pub release: Rc<str>,
    pub r_acquire: Rc<str>,
    pub r_unlock: Rc<str>,
}

impl Scripts {
    pub fn real() -> Scripts {
        let src = |f| redis_rlock::protocol::script_source(f).expect("a script of the crate");
        Scripts {
            acquire: src("acquire.lua").into(),
            take: src("take.lua").into(),
            unlock: src("unlock.lua").into(),
            release: src("release.lua").into(),
            r_acquire: redisson::ACQUIRE.into(),
            r_unlock: redisson::UNLOCK.into(),
        }
    }

    /// These scripts with one text edited (a seeded bug): `from` must occur in it.
    pub fn edit(
        mut self,
        which: fn(&mut Scripts) -> &mut Rc<str>,
        from: &str,
        to: &str,
    ) -> Scripts {
        let text = which(&mut self);
        assert!(
            text.contains(from),
            "the seeded bug's text is not in the script: {from}"
        );
        *text = text.replacen(from, to, 1).into();
        self
    }

    /// These scripts with `from` edited in every one of the crate's plain-lock scripts
    /// that holds it (a seeded bug in a prelude they share): at least one must.
    pub fn edit_all(mut self, from: &str, to: &str) -> Scripts {
        let mut found = false;
        for text in [
            &mut self.acquire,
            &mut self.take,
            &mut self.unlock,
            &mut self.release,
        ] {
            if text.contains(from) {
                *text = text.replacen(from, to, 1).into();
                found = true;
            }
        }
        assert!(found, "the seeded bug's text is in no script: {from}");
        self
    }

    /// The text of `lua/<name>`, as this world runs it.
    pub fn named(&self, name: &str) -> Rc<str> {
        match name {
            "acquire.lua" => self.acquire.clone(),
            "take.lua" => self.take.clone(),
            "unlock.lua" => self.unlock.clone(),
            "release.lua" => self.release.clone(),
            other => panic!("no script {other} in the model"),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Faults {
    pub lost_replies: u8,
    pub lost_messages: u8,
    pub crashes: u8,
    pub restarts: u8,
    /// Releases whose first send is stuck and runs late (`late.rs`).
    pub late_copies: u8,
}

/// One crate client: how many tasks, rounds per task, and its lease.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ClientCfg {
    pub tasks: usize,
    pub rounds: u8,
    pub lease: u64,
}

#[derive(Clone)]
pub struct Config {
    pub clients: Vec<ClientCfg>,
    pub redisson: Vec<(redisson::Kind, u64)>,
    /// The clock stops here (ms after `EPOCH`).
    pub time_bound: u64,
    pub faults: Faults,
    /// Bounded bypass: at most this many grants to other owners, without the lock being
    /// free in between, while an actor waits.
    pub bypass: u8,
    pub turn_window: u64,
    pub latch_ttl: u64,
    /// The client's bounds on a run of hand-overs (`policy::run::Limits`), its window in
    /// model ms.
    pub handover: redis_rlock::policy::run::Limits,
    pub scripts: Scripts,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct World {
    pub store: Store,
    pub redisson: Vec<Actor>,
    pub clients: Vec<Client>,
    pub faults: Faults,
    /// Per waiting owner (Redisson actor i, or crate client c as `100 + c`): grants to
    /// other owners since the lock was last free.
    pub passed: Vec<(u8, u8)>,
    /// Properties judged on a step rather than a state, once broken.
    pub broken: BTreeSet<&'static str>,
    /// Sends on their way, to run at any later point.
    pub late: Vec<super::late::Copy>,
    #[allow(clippy::struct_field_names)]
    #[doc(hidden)]
    pub cfg: CfgRef,
}

/// The config, shared by every state; left out of hashing and equality.
#[derive(Clone)]
pub struct CfgRef(pub Rc<Config>);

impl std::ops::Deref for CfgRef {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.0
    }
}
impl std::hash::Hash for CfgRef {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}
impl PartialEq for CfgRef {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for CfgRef {}
impl std::fmt::Debug for CfgRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cfg")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Tick,
    Redisson(usize),
    /// Client c's task t takes its next step; `lost`: its reply never comes.
    Task(usize, usize, bool),
    /// Deliver (or, `lost`, drop) the next message to Redisson actor i.
    ToRedisson(usize, bool),
    ToClient(usize, bool),
    Crash(usize),
    Restart,
    /// Client c's task t sends its release into a connection it gives up.
    Stuck(usize, usize),
    /// The i-th late copy reaches Redis.
    Late(usize),
}

impl World {
    pub fn new(cfg: Config) -> World {
        let cfg = CfgRef(Rc::new(cfg));
        World {
            store: Store::new(EPOCH),
            redisson: cfg
                .redisson
                .iter()
                .map(|(k, l)| Actor::new(*k, *l))
                .collect(),
            clients: (0..cfg.clients.len())
                .map(|c| Client::new(&cfg, c))
                .collect(),
            faults: cfg.faults,
            passed: Vec::new(),
            broken: BTreeSet::new(),
            late: Vec::new(),
            cfg,
        }
    }

    pub fn now(&self) -> u64 {
        self.store.now_ms
    }

    pub fn lock_channel(&self) -> String {
        redis_rlock::protocol::channel_name(LOCK)
    }

    /// Runs a script on the store with the subscriptions as they are now; hands its
    /// messages to their subscribers and judges the step's own properties.
    pub fn run<K: AsRef<[u8]>, A: AsRef<[u8]>>(
        &mut self,
        src: &Rc<str>,
        keys: &[K],
        args: &[A],
    ) -> Reply {
        self.sync_subscribers();
        let before = self.store.clone();
        let reply = super::cache::run(&mut self.store, src, keys, args);
        for p in props::on_step(&before, &self.store) {
            self.broken.insert(p);
        }
        props::count_bypass(self, &before);
        for m in self.store.drain_outbox() {
            let channel = String::from_utf8_lossy(&m.channel).to_string();
            if channel == self.lock_channel() && super::client::is_unlock_message(&m.payload) {
                for a in self.redisson.iter_mut().filter(|a| a.subscribed()) {
                    a.pending += 1;
                }
            }
            for c in self.clients.iter_mut() {
                c.hear(&channel, &m.payload);
            }
        }
        reply
    }

    fn sync_subscribers(&mut self) {
        let mut subs = std::collections::BTreeMap::new();
        let mut marks = std::collections::BTreeMap::new();
        let lock = self.lock_channel().into_bytes();
        let ours = self.clients.iter().filter(|c| c.listening()).count();
        let n = self.redisson.iter().filter(|a| a.subscribed()).count() + ours;
        if n > 0 {
            subs.insert(lock.clone(), n as u64);
        }
        // A listening client with turns on also marks the channel in the sharded
        // namespace (`src/wire/pubsub/listener.rs`), as on a single server.
        if ours > 0 && self.cfg.turn_window > 0 {
            marks.insert(lock, ours as u64);
        }
        self.store.subscribers = subs;
        self.store.shard_subscribers = marks;
    }

    pub fn all_done(&self) -> bool {
        self.redisson.iter().all(|a| a.done()) && self.clients.iter().all(|c| c.done())
    }

    fn actions(&self) -> Vec<Action> {
        let now = self.now();
        let mut out = Vec::new();
        if now < EPOCH + self.cfg.time_bound {
            out.push(Action::Tick);
        }
        for (i, a) in self.redisson.iter().enumerate() {
            if a.enabled(now) {
                out.push(Action::Redisson(i));
            }
            if a.pending > 0 {
                out.push(Action::ToRedisson(i, false));
                if self.faults.lost_messages > 0 {
                    out.push(Action::ToRedisson(i, true));
                }
            }
        }
        for (c, cl) in self.clients.iter().enumerate() {
            for t in cl.enabled(now) {
                out.push(Action::Task(c, t, false));
                if self.faults.lost_replies > 0 && cl.may_lose_reply(t) {
                    out.push(Action::Task(c, t, true));
                }
                if self.faults.late_copies > 0 && client::may_stick(cl, t) {
                    out.push(Action::Stuck(c, t));
                }
            }
            if !cl.inbox.is_empty() {
                out.push(Action::ToClient(c, false));
                if self.faults.lost_messages > 0 {
                    out.push(Action::ToClient(c, true));
                }
            }
            if self.faults.crashes > 0 && !cl.done() {
                out.push(Action::Crash(c));
            }
        }
        if self.faults.restarts > 0 && self.store.live().next().is_some() {
            out.push(Action::Restart);
        }
        out.extend((0..self.late.len()).map(Action::Late));
        out
    }

    fn apply(&mut self, a: Action) -> String {
        let line = match a {
            Action::Tick => {
                self.store.now_ms += 1;
                format!("tick to {} ms", self.now() - EPOCH)
            }
            Action::Redisson(i) => redisson::step(self, i),
            Action::Task(c, t, lost) => {
                if lost {
                    self.faults.lost_replies -= 1;
                }
                client::step(self, c, t, lost)
            }
            Action::ToRedisson(i, lost) => {
                let r = &mut self.redisson[i];
                r.pending -= 1;
                if lost {
                    self.faults.lost_messages -= 1;
                    format!("R{i}: unlock message lost")
                } else {
                    r.permit = true;
                    format!("R{i}: hears unlock message")
                }
            }
            Action::ToClient(c, lost) => {
                if lost {
                    self.faults.lost_messages -= 1;
                    let m = self.clients[c].inbox.pop_front();
                    format!("C{c}: message {m:?} lost")
                } else {
                    client::deliver(self, c)
                }
            }
            Action::Stuck(c, t) => {
                self.faults.late_copies -= 1;
                client::stuck_release(self, c, t)
            }
            Action::Late(i) => super::late::deliver(self, i),
            Action::Crash(c) => {
                self.faults.crashes -= 1;
                self.clients[c].crash();
                format!("C{c} crashes")
            }
            Action::Restart => {
                self.faults.restarts -= 1;
                let now = self.now();
                self.store = Store::new(now);
                for r in &mut self.redisson {
                    r.pending = 0;
                }
                for c in &mut self.clients {
                    c.inbox.clear();
                }
                "Redis restarts without persistence: every key is gone".to_string()
            }
        };
        self.store.purge_expired();
        props::reset_bypass_if_free(self);
        line
    }
}

pub(super) fn client_line_key() -> String {
    redis_rlock::protocol::clients_key(LOCK)
}

/// The world as a model for the explorer. Where every client is configured alike,
/// states that differ only by which client is which, or which of a client's tasks is
/// which, are one state (symmetry reduction).
pub struct Checked(pub Config);

impl Model for Checked {
    type State = World;
    type Action = Action;

    fn init(&self) -> World {
        World::new(self.0.clone())
    }

    fn actions(&self, s: &World) -> Vec<Action> {
        s.actions()
    }

    fn step(&self, s: &World, a: &Action) -> (World, String) {
        let mut next = s.clone();
        let line = next.apply(*a);
        let at = next.now() - EPOCH;
        (next, format!("[{at} ms] {line}"))
    }

    fn violations(&self, s: &World) -> Vec<&'static str> {
        props::check(s)
    }

    fn fingerprint(&self, s: &World) -> u128 {
        let cfg = &self.0.clients;
        if cfg.is_empty() {
            return super::explore::fingerprint(s);
        }
        let alike = cfg.iter().all(|c| *c == cfg[0]);
        super::explore::fingerprint(&s.renamed(&s.sorting(alike)))
    }

    fn describe(&self, s: &World) -> String {
        let keys: Vec<String> = s
            .store
            .live()
            .map(|(k, e)| {
                let ttl = e.expires_at.map_or(-1, |t| t as i64 - s.now() as i64);
                format!("{} = {} (PTTL {ttl})", text(k), show(&e.value))
            })
            .collect();
        format!("keys [{}]", keys.join(", "))
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A value as text, for traces.
fn show(v: &crate::checker::store::Value) -> String {
    use crate::checker::store::Value;
    match v {
        Value::Str(s) => text(s),
        Value::Hash(h) => {
            let f: Vec<String> = h
                .iter()
                .map(|(k, v)| format!("{}: {}", text(k), text(v)))
                .collect();
            format!("{{{}}}", f.join(", "))
        }
        Value::List(l) => {
            let items: Vec<String> = l.iter().map(|i| text(i)).collect();
            format!("[{}]", items.join(", "))
        }
        Value::ZSet(z) => format!("{z:?}"),
    }
}

/// Messages a crate client has heard and not yet handled.
pub type Inbox = VecDeque<client::Msg>;
