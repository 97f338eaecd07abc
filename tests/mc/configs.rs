//! The checked configurations: who takes part, their leases and rounds, the time bound
//! and the fault budgets. Each is explored exhaustively by `explore::explore`.

use super::redisson::Kind;
use std::time::Duration;

use redis_rlock::policy::run::Limits;

use super::world::{ClientCfg, Config, Faults, Scripts};

/// The defaults every config starts from: no actors, no faults, a 6 ms time bound, a
/// 2 ms turn window, latches kept 4 ms, the client's own bounds on a run of hand-overs
/// with a 2 ms window, and a bypass bound of 1 grant across owners.
pub fn base() -> Config {
    Config {
        clients: Vec::new(),
        redisson: Vec::new(),
        time_bound: 6,
        faults: Faults::default(),
        bypass: 1,
        turn_window: 2,
        latch_ttl: 4,
        handover: Limits {
            limit: redis_rlock::DEFAULT_HANDOVER_LIMIT,
            window: Duration::from_millis(2),
            asks_at_end: true,
        },
        scripts: Scripts::real(),
    }
}

pub fn client(tasks: usize, rounds: u8, lease: u64) -> ClientCfg {
    ClientCfg {
        tasks,
        rounds,
        lease,
    }
}

/// Hand-countable: one Redisson poller, lease 1 ms, time bound 1 ms (8 states, 8
/// transitions; see `tests/model_check.rs`).
pub fn tiny() -> Config {
    Config {
        redisson: vec![(Kind::Poller(2), 1)],
        time_bound: 1,
        ..base()
    }
}

/// Redisson alone: two `lock()` waiters and a `tryLock()` poller of 3 tries.
pub fn redisson_only() -> Config {
    Config {
        redisson: vec![(Kind::Waiter, 3), (Kind::Waiter, 3), (Kind::Poller(3), 3)],
        ..base()
    }
}

/// One client of this crate with two tasks, a Redisson waiter and a Redisson poller.
pub fn mixed() -> Config {
    Config {
        clients: vec![client(2, 1, 3)],
        redisson: vec![(Kind::Waiter, 3), (Kind::Poller(3), 3)],
        time_bound: 3,
        ..base()
    }
}

/// Two clients of this crate, the first with two tasks, and a Redisson poller (issue
/// 24, finding 1: direct grants between clients passed the poller over).
pub fn direct_chain() -> Config {
    Config {
        clients: vec![client(2, 1, 3), client(1, 1, 3)],
        redisson: vec![(Kind::Poller(3), 3)],
        time_bound: 3,
        ..base()
    }
}

/// A client holds while another client's two tasks wait (issue 24, finding 2: a line
/// emptied by LPOP and made anew by RPUSH had no TTL).
pub fn keep_naming() -> Config {
    Config {
        clients: vec![client(1, 1, 3), client(2, 1, 3)],
        time_bound: 3,
        ..base()
    }
}

/// A waiter with a long lease, then one of another client with a short lease, behind a
/// Redisson holder (issue 24, finding 4).
pub fn short_join() -> Config {
    Config {
        clients: vec![client(1, 1, 6), client(1, 1, 2)],
        redisson: vec![(Kind::Poller(1), 6)],
        time_bound: 4,
        ..base()
    }
}

/// One client of this crate with two tasks and a Redisson `lock()` waiter, 3 ms: the
/// base of the fault configs and of the seeded bugs.
pub fn small() -> Config {
    Config {
        clients: vec![client(2, 1, 3)],
        redisson: vec![(Kind::Waiter, 3)],
        time_bound: 3,
        ..base()
    }
}

/// `small` with these fault budgets.
pub fn small_with(faults: Faults) -> Config {
    Config { faults, ..small() }
}

/// Two clients of this crate with one task each and a Redisson `lock()` waiter, which
/// nobody may pass over (bypass bound 0).
pub fn two_and_waiter() -> Config {
    Config {
        clients: vec![client(1, 1, 3), client(1, 1, 3)],
        redisson: vec![(Kind::Waiter, 3)],
        time_bound: 3,
        bypass: 0,
        ..base()
    }
}

/// One client's task of two rounds whose first release is stuck and runs late (finding
/// 7), and a Redisson `tryLock()` poller that takes the lock whenever it is free.
pub fn late_copy() -> Config {
    Config {
        clients: vec![client(1, 2, 4)],
        redisson: vec![(Kind::Poller(4), 2)],
        time_bound: 5,
        faults: Faults {
            late_copies: 1,
            ..Faults::default()
        },
        ..base()
    }
}

/// The issue's bound: three clients of this crate with two tasks each, a Redisson
/// `lock()` waiter and a Redisson `tryLock()` poller, one round each.
pub fn issue_bound(time_bound: u64) -> Config {
    Config {
        clients: vec![client(2, 1, 3); 3],
        redisson: vec![(Kind::Waiter, 3), (Kind::Poller(2), 3)],
        time_bound,
        ..base()
    }
}
