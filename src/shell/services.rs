//! What a client's locks share: the command connection, the watchdog, the pub/sub hub,
//! the janitor, the per-client tables and the background work. [`Client`](crate::Client)
//! is the public facade over it; the locks below it hold this, never the facade.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tokio::runtime::Handle;

use crate::background::{Background, Signal, Spawner};
use crate::config::{Config, ReplicaSync};
use crate::error::{Error, Result};
use crate::shell::watchdog::Watchdog;
use crate::state::Core;
use crate::stats::Counters;
use crate::wire::connection::Conn;
use crate::wire::janitor::Janitor;
use crate::wire::pubsub::PubSubHub;

/// Whether a script can count every subscriber of a lock's channel with `PUBSUB NUMSUB`
/// (or `SHARDNUMSUB`), and so tell whether anyone outside its client waits.
pub(crate) fn counts_listeners(conn: &Conn) -> bool {
    // A cluster's classic pub/sub reaches subscribers on every node, but the script
    // counts those of its own node only, and would not see a Redisson waiter elsewhere.
    !conn.is_cluster() || conn.publish_command() == "spublish"
}

/// Whether a run of hand-overs past its window may go on when the unlock script finds
/// nobody else waiting (`docs/protocol.md` 2.2): where it can count the lock's
/// subscribers, and not where replicas are synced with (Sentinel and Cluster by
/// default), since a Redisson client may subscribe at a replica, where the master's
/// count does not see it.
pub(crate) fn runs_past_window(conn: &Conn) -> bool {
    matches!(conn.sync(), ReplicaSync::Off) && counts_listeners(conn)
}

/// One client's shared services.
pub(crate) struct ClientInner {
    pub(crate) id: String,
    pub(crate) conn: Conn,
    pub(crate) config: Config,
    pub(crate) watchdog: Watchdog,
    pub(crate) pubsub: PubSubHub,
    pub(crate) janitor: Janitor,
    /// What the client knows of each lock name (see [`crate::state`]).
    pub(crate) core: Arc<Core>,
    /// What the client has done, counted (see [`crate::Stats`]).
    pub(crate) stats: Arc<Counters>,
    pub(crate) background: Arc<Background>,
    /// Set by [`Client::shutdown`](crate::Client::shutdown): no new acquisition, waiters leave with `Closed`.
    pub(crate) closed: Signal,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // The last handle and the last guard are gone: nothing may keep running for a
        // client nobody can use.
        self.background.stop_services();
    }
}

impl ClientInner {
    /// How long one acquire or unlock may take, retries and reconnects included, and a
    /// little more: how long an offered waiter waits for the unlock carrying its offer,
    /// and a request waits for earlier ones of the same holder field.
    pub(crate) fn offer_bound(&self) -> Duration {
        // A synced unlock also waits for its `WAIT` (and a `ROLE` when nobody acked).
        let sync = match self.conn.sync() {
            ReplicaSync::Wait { timeout, .. } => *timeout,
            ReplicaSync::Off => Duration::ZERO,
        };
        (self.config.response_timeout + self.config.connect_timeout) * 3
            + sync
            + Duration::from_millis(100)
    }

    /// The runtime for this client's background work (see [`Watchdog::home`]).
    pub(crate) fn runtime(&self) -> Handle {
        self.watchdog.home()
    }

    /// Where this client's errands go (see [`crate::background`]).
    pub(crate) fn spawner(&self) -> Spawner {
        Spawner {
            background: self.background.clone(),
            runtime: self.runtime(),
        }
    }

    /// `Err(Closed)` once the client was shut down.
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.is_set() {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Whether releases may be handed to this client's waiters (see
    /// [`ClientBuilder::handover_limit`](crate::ClientBuilder::handover_limit)). With
    /// replica sync a hand-over waits for a replica like an acquire, and one that none
    /// acknowledged is given back by its waiter (`acquire/waiting.rs`).
    pub(crate) fn hands_over(&self) -> bool {
        self.config.handover_limit > 0
    }

    /// Until when this client's calls for `name` leave it to others: it just ended a
    /// run of hand-overs on it, or its turn came with a subscriber outside the line to
    /// yield to first. A holder of the name never holds back (its re-entry must go
    /// through); the callers see to that.
    pub(crate) fn held_back(&self, name: &str, channel: &str) -> Option<Instant> {
        let run = self.core.held_back(name);
        let turn = self.pubsub.yielding(channel);
        run.max(turn)
    }

    /// How long a request latch is kept: long enough to outlive every retry of its
    /// request, short enough not to pile up.
    pub(crate) fn latch_ttl(&self) -> Duration {
        // Capped so that absurd timeouts cannot push PX past Redis's range.
        ((self.config.response_timeout + self.config.connect_timeout) * 4)
            .min(Duration::from_secs(24 * 3600))
    }
}
