//! The decisions a client makes about one lock name, apart from any IO: no Redis, no
//! tokio, no clock and no locks. Plain data goes in and a decision comes out; the async
//! shell (`acquire`, `release`, `handover`) reads the clock and Redis's answers, asks
//! here, and carries the decision out. The model checker (`tests/mc/`) asks the same
//! functions with its model clock, so the decisions it explores are the client's own.
//!
//! Public for the checker only: it is no stable API, and a service has no use for it.
//!
//! - [`line`](mod@line): what a grant does to the client's place in the lock's line (turns).
//! - [`run`](mod@run): a run of hand-overs inside the client: whom a release offers the lock, on
//!   which terms, and when the run ends.
//! - [`wait`](mod@wait): how long a waiting call sleeps before it asks again, with what the
//!   family's waiters keep alive by asking (a fair lock's deadline, a read-write mark).
//! - [`waiter`](mod@waiter): one waiting acquisition as one state ([`waiter::Step`]), and
//!   what an attempt's answer, a sleep's end or a look at the lock makes it do next.

pub mod line;
pub mod run;
pub mod wait;
pub mod waiter;
