//! The differential test's parts: a server and a store in lockstep ([`twin`]), what is
//! compared ([`compare`]), and seeded sequences of script calls shaped as `src/` sends
//! them ([`locks`], [`rw`], [`sync`], [`fuzz`]).

/// A call of `lua/<name>.lua`, as the client sends it (its prelude included).
macro_rules! script {
    ($name:literal) => {
        $crate::store_diff::twin::Call::new(
            concat!($name, ".lua"),
            redis_rlock::protocol::script_source(concat!($name, ".lua"))
                .expect(concat!("no script ", $name)),
        )
    };
}

pub mod compare;
pub mod fuzz;
pub mod locks;
pub mod rw;
pub mod subscriber;
pub mod sync;
pub mod twin;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::checker::store::{Reply, Store};
use twin::{Stats, Step, Twin};

/// A small seeded generator (splitmix64): the sequences repeat from their seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }

    /// True with this chance in percent.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    /// One of `weighted`'s values, each as likely as its weight.
    pub fn weighted<T: Copy>(&mut self, weighted: &[(u32, T)]) -> T {
        let total: u32 = weighted.iter().map(|w| w.0).sum();
        let mut at = self.below(total as usize) as u32;
        for (w, v) in weighted {
            if at < *w {
                return *v;
            }
            at -= w;
        }
        unreachable!("a pick within the total weight")
    }
}

/// Runs one command through a script, as the client's plain commands (and the
/// checker's perturbations) reach the server.
pub const COMMAND: &str = "return redis.pcall(unpack(ARGV))";

/// A call of one command, on both sides.
pub fn command(args: &[&str]) -> twin::Call {
    args.iter()
        .fold(twin::Call::new("command", COMMAND), |c, a| c.arg(a))
}

/// Runs one command on a key, then gives the key a short TTL: a key of another type,
/// or a value that is no count, reaches the scripts' error paths for a while without
/// leaving the name broken for the rest of a run.
const CLOBBER: &str = "redis.call(unpack(ARGV)); return redis.call('pexpire', KEYS[1], 100)";

/// A call of [`CLOBBER`]: `args` is the whole command, its key first after the name.
pub fn clobber(args: &[&str]) -> twin::Call {
    let c = twin::Call::new("clobber", CLOBBER).key(args[1]);
    args.iter().fold(c, |c, a| c.arg(a))
}

/// The fields of the hash `key` in the store (none if it is no hash): the holders,
/// which a step's unlock or renewal then names more often than a random field.
pub fn fields(store: &Store, key: &str) -> Vec<String> {
    let hash = store.hash(key.as_bytes()).ok().flatten();
    hash.into_iter()
        .flat_map(|h| h.keys())
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect()
}

/// The seed of a family: `STORE_DIFF_SEED` if set, else the family's own.
pub fn seed(default: u64) -> u64 {
    std::env::var("STORE_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// How many steps a family runs: `STORE_DIFF_STEPS` if set, else `default`.
pub fn steps(default: usize) -> usize {
    std::env::var("STORE_DIFF_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Runs up to `steps` steps from `next` (at most `limit` long) on a fresh twin, and
/// prints what ran: the stats, and how often each script answered what.
pub fn run_family(
    family: &str,
    seed: u64,
    steps: usize,
    limit: Duration,
    mut next: impl FnMut(&mut Rng, &Store) -> Step,
) -> Stats {
    let mut twin = Twin::start(2);
    let mut rng = Rng::new(seed);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut untimed: BTreeMap<String, (&'static str, usize)> = BTreeMap::new();
    let start = Instant::now();
    while twin.stats.steps < steps && start.elapsed() < limit {
        let step = next(&mut rng, &twin.store);
        if let (Some(reply), Step::Call(c)) = (twin.step(&step), &step) {
            *seen
                .entry(format!("{} -> {}", c.script, gist(&reply)))
                .or_default() += 1;
            if c.script.ends_with(".lua") {
                note_untimed(&twin.store, c.script, &mut untimed);
            }
        }
    }
    eprintln!(
        "{family}: seed {seed}, {:?} in {:.1} s",
        twin.stats,
        start.elapsed().as_secs_f64()
    );
    for (what, n) in &seen {
        eprintln!("  {n:5} {what}");
    }
    for (key, (script, n)) in &untimed {
        eprintln!("  no TTL after {n:4} script calls: {key} (first after {script})");
    }
    twin.stats
}

/// Counts, per key, the script calls after which it was left without a TTL (and which
/// script first left it so): every key the crate writes should expire.
fn note_untimed(
    store: &Store,
    script: &'static str,
    untimed: &mut BTreeMap<String, (&'static str, usize)>,
) {
    for (k, e) in store.live() {
        if e.expires_at.is_none() {
            let name = k.escape_ascii().to_string();
            untimed.entry(name).or_insert((script, 0)).1 += 1;
        }
    }
}

/// A reply's gist for the coverage list: the value of an integer, the first element of
/// an array, the code of an error.
fn gist(r: &Reply) -> String {
    match r {
        Reply::Array(items) => match items.first() {
            Some(first) => format!("[{}, ..]", gist(first)),
            None => "[]".into(),
        },
        Reply::Error(e) if e.starts_with("ERR") => format!("error {}", &e[..e.len().min(70)]),
        Reply::Error(e) => format!("error {}", e.split(' ').next().unwrap_or("")),
        Reply::Bulk(b) if b.len() > 12 => "a bulk string".into(),
        Reply::Bulk(b) => format!("{:?}", b.escape_ascii().to_string()),
        other => format!("{other:?}"),
    }
}
