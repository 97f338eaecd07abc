//! Late copies: a send stuck in a connection the client gave up, which reaches Redis at
//! any later point (its bytes flushed once a partition heals), after the client sent
//! the request again on another connection and went on (issue 24's finding 7).

use std::rc::Rc;

use super::world::World;

/// A send on its way: the script and the keys and arguments it was sent with.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Copy {
    pub script: &'static str,
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

impl Copy {
    /// This copy with every key and argument renamed (symmetry).
    pub fn renamed(&self, rename: &dyn Fn(&[u8]) -> Vec<u8>) -> Copy {
        let each = |v: &[String]| {
            v.iter()
                .map(|s| String::from_utf8(rename(s.as_bytes())).expect("a name"))
                .collect()
        };
        Copy {
            script: self.script,
            keys: each(&self.keys),
            args: each(&self.args),
        }
    }
}

/// Keeps a copy of a send, to run later.
pub fn hold_back(w: &mut World, script: &'static str, keys: &[String], args: &[String]) {
    w.late.push(Copy {
        script,
        keys: keys.to_vec(),
        args: args.to_vec(),
    });
}

/// Runs the i-th copy on the store now; its reply goes nowhere.
pub fn deliver(w: &mut World, i: usize) -> String {
    let copy = w.late.remove(i);
    let src: Rc<str> = w.cfg.scripts.named(copy.script);
    let reply = w.run(&src, &copy.keys, &copy.args);
    format!(
        "a late copy of {} {:?} for {} runs -> {reply:?}",
        copy.script,
        copy.args.last(),
        copy.args.get(1).map_or("?", |f| f.as_str())
    )
}
