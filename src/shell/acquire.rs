//! A waiter's whole life: the waiting loop of an acquisition (attempt, subscribe, sleep
//! until woken, handed the lock, or out of time, and attempt again) over one
//! [`Waiting`](waiting::Waiting), which holds what the waiter takes of its client (its
//! part in the line, `line.rs`; its subscription; its place in the hand-over queue) and
//! gives it all back in its one `Drop`. What each step's outcome makes it do next is
//! `policy::waiter`'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

mod line;
mod waiting;

pub(crate) use waiting::Wait;
use waiting::{First, Step, Waiting};

use crate::config::{check_lease, whole_ms};
use crate::error::{Error, Result};
use crate::identity::Kind;
use crate::identity::OwnerId;
use crate::policy::line::Counted;
use crate::policy::wait::{sleep_bound, Waits, RW_MARK};
use crate::shell::attempt::Tried;
use crate::shell::held::Held;
use crate::shell::target::Target;
use crate::stats::Event;

/// Whether a waiting call holds back until `until` (its client just ended a run of
/// hand-overs): not if that would leave it less of its wait than the hold-back takes,
/// since it would then only time out unasked.
pub(crate) fn worth_holding_back(until: Instant, deadline: Option<Instant>) -> bool {
    let now = Instant::now();
    deadline
        .is_none_or(|d| d.saturating_duration_since(until) >= until.saturating_duration_since(now))
}

impl Target {
    pub(crate) async fn acquire_unbounded(&self, lease: Option<Duration>) -> Result<Held> {
        // A wait without a deadline only ends with the lock or an error; the loop states
        // that without an internal error nobody could act on.
        loop {
            if let Some(guard) = self.acquire(lease, Wait::Until(None)).await? {
                return Ok(guard);
            }
        }
    }

    pub(crate) async fn acquire(
        &self,
        lease: Option<Duration>,
        wait: Wait,
    ) -> Result<Option<Held>> {
        self.check_usable()?;
        if let Some(l) = lease {
            check_lease(l)?;
        }
        let lease = lease.map(whole_ms);
        let (owner, field) = self.current_field();
        if self.kind == Kind::Write {
            self.refuse_upgrade(owner)?;
        }
        let span = tracing::debug_span!("acquire", lock = %self.name, owner = %field);
        let started = Instant::now();
        let got = self
            .acquire_as(owner, field, lease, wait)
            .instrument(span)
            .await;
        if let Ok(Some(_)) = &got {
            self.inner().stats.count(Event::Acquired(started.elapsed()));
        }
        got
    }

    async fn acquire_as(
        &self,
        owner: OwnerId,
        field: Arc<str>,
        lease: Option<Duration>,
        wait: Wait,
    ) -> Result<Option<Held>> {
        let started = Instant::now();
        // Where this client's own waiters already queue for the name, a new waiter
        // defers to them; a holder never does (its re-entry must go through).
        let mut behind = None;
        // Only a plain lock hands over, so the waiters of other kinds always ask Redis.
        if let (Wait::Until(deadline), Kind::Plain) = (wait, self.kind) {
            let inner = self.inner();
            let holder = || inner.core.holds(&self.name, &field);
            if let Some(until) = inner.held_back(&self.name, &self.channel) {
                // This client just ended a run of hand-overs on the name, or yields its
                // turn: the waiters the release woke (in other clients too) go first.
                if !holder() && worth_holding_back(until, deadline) {
                    tokio::time::sleep_until(until).await;
                }
            } else if let Some(until) = inner
                .hands_over()
                .then(|| inner.core.behind(&self.name))
                .flatten()
            {
                // Others of this client sleep on it, so it is held until at least `until`
                // as far as anyone here knows: join the queue without asking Redis.
                if !holder() {
                    behind = Some(until.saturating_duration_since(Instant::now()));
                }
            }
        }
        let mut waiting = Waiting::new(self, owner, field, lease, wait);
        // A waiter that joins a confirmed subscription before its first attempt hears of
        // every release after that attempt: once answered busy, it can sleep at once.
        let subscribed_first = match (wait, self.kind, behind) {
            (Wait::Until(_), Kind::Plain, None) if self.inner().pubsub.is_ready(&self.channel) => {
                waiting.subscribe_early()
            }
            _ => false,
        };
        // A caller that will wait counts among its client's waiters in line before its
        // first attempt is sent, not once it is answered: a grant to another waiter of
        // the client meanwhile then keeps the client in line (`k`) instead of taking it
        // out while this attempt finds it there and so does not join.
        if matches!(wait, Wait::Until(_)) && behind.is_none() {
            waiting.line.join_before_attempt();
        }
        let ttl = match behind {
            Some(left) => Some(left),
            None => match waiting.first_attempt(started).await? {
                First::Held(guard) => return Ok(Some(guard)),
                First::Busy(ttl) => ttl,
            },
        };
        let Wait::Until(deadline) = wait else {
            return Ok(None);
        };
        // The busy reply put this client in the lock's line in Redis (with turns on), or,
        // for a waiter queued behind others of its client, they did: it counts among the
        // client's waiters in line either way, so that the client keeps its place while
        // any of them waits (its waiters let other clients' turn messages pass).
        waiting.line.busy();
        tracing::debug!(?ttl, "lock busy; waiting");
        let Some(bound) = self.bound(ttl, deadline) else {
            waiting.line.leave().await;
            return Ok(None);
        };
        if !subscribed_first {
            // The unlock may have happened between the first attempt and the
            // subscription; the attempt right after the SUBSCRIBE is confirmed covers it.
            waiting.sub().ready(bound).await;
        }
        waiting.take_place();
        waiting.started = Instant::now();
        // A waiter that joined the queue without an attempt sleeps first, as does one
        // that was subscribed before its attempt.
        let mut step = match behind {
            Some(left) => Step::Sleep {
                ttl: Some(left),
                lease_known: false,
            },
            None if subscribed_first => Step::Sleep {
                ttl,
                lease_known: true,
            },
            None => Step::Attempt { adopt: false },
        };
        let outcome = loop {
            step = match step {
                Step::Attempt { adopt } => {
                    waiting.adopt |= adopt;
                    waiting.attempt().await
                }
                Step::Look => waiting.look().await,
                Step::Sleep { ttl, lease_known } => waiting.sleep(ttl, lease_known).await,
                // Carried out where the grant is known (`Waiting::sleep`).
                Step::GiveBack => Step::Attempt { adopt: false },
                Step::Done(outcome) => break outcome,
            };
        };
        // A holder leaves in the background; one that gives up is out before it returns.
        if !matches!(outcome, Ok(Some(_))) {
            waiting.line.leave().await;
        }
        outcome
    }

    /// A task that holds the read lock would wait for itself forever if it asked for the
    /// write lock (Redisson's readers block every writer, their own too): refused at once.
    fn refuse_upgrade(&self, owner: OwnerId) -> Result<()> {
        let read = Target {
            kind: Kind::Read,
            ..self.clone()
        };
        // A writer that also reads (it downgraded) re-enters its write lock as usual.
        let core = &self.inner().core;
        if core.holds(&self.name, &read.field_of(owner))
            && !core.holds(&self.name, &self.field_of(owner))
        {
            return Err(Error::UpgradeRefused {
                name: self.name.to_string(),
            });
        }
        Ok(())
    }

    /// How long to sleep before the next attempt: until the holder's lease runs out or
    /// the deadline comes, whichever is first. `None` when the deadline has passed.
    fn bound(&self, ttl: Option<Duration>, deadline: Option<Instant>) -> Option<Duration> {
        // A key without expiry was not written by a lease lock; check back now and then.
        // A fair waiter's attempts move its deadline in the queue (a live waiter is never
        // taken as gone, Redisson #3004); a read-write waiter's renew its mark.
        let waits = match self.kind {
            Kind::Fair => Waits::Fair {
                wait_timeout: self.inner().config.fair_lock_wait_timeout,
            },
            Kind::Read | Kind::Write => Waits::ReadWrite { mark: RW_MARK },
            Kind::Plain => Waits::Plain,
        };
        let ttl = sleep_bound(waits, ttl, self.inner().config.watchdog_timeout);
        match deadline {
            None => Some(ttl),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    None
                } else {
                    Some(ttl.min(left))
                }
            }
        }
    }

    /// [`attempt`](Self::attempt), bounded: by the deadline of a waiting call, and by one
    /// response timeout for a single try. `None` when the bound came first; an attempt
    /// already sent then finishes in the background, and a hold it took is given back.
    /// `in_line`: how it counts among its client's waiters in the lock's line (turns).
    async fn attempt_within(
        &self,
        owner: OwnerId,
        field: &Arc<str>,
        lease: Option<Duration>,
        adopt: bool,
        wait: Wait,
        in_line: Counted,
    ) -> Result<Option<Tried>> {
        self.inner().check_open()?;
        let until = match wait {
            Wait::No => Instant::now().checked_add(self.inner().config.response_timeout),
            Wait::Until(deadline) => deadline,
        };
        let waits = matches!(wait, Wait::Until(_));
        let attempt = self.attempt(owner, field, lease, adopt, waits, in_line);
        match until {
            None => attempt.await.map(Some),
            Some(at) => match tokio::time::timeout_at(at, attempt).await {
                Ok(tried) => tried.map(Some),
                Err(_) => Ok(None),
            },
        }
    }
}
