//! The client's state per lock name, shared by its tasks under one mutex: the holds by
//! field and the requests in flight, the sleeping waiters, and the hand-over runs over
//! them. No Redis and no IO here: each change is one critical section that asks `policy`
//! what to do.
//!
//! [`Core`] is the shell's one way in: the modules below are private, and what they
//! hand out (guards that settle a request or a waiter when dropped, and the values a
//! decision returns) is re-exported here.
//! - `table`: the names and, per name, the holds of each field and the requests in
//!   flight (`table/holds.rs`: the decisions on one field's holds).
//! - `queue`: the tasks asleep waiting for a name, one [`Ticket`] each, and the run of
//!   hand-overs over them.
//! - `handover`: whom a release offers the lock, and a waiting task's [`Waiter`].

mod handover;
mod queue;
mod table;

pub(crate) use handover::{Left, Waiter};
pub(crate) use queue::{Grant, Offer, Terms, Ticket, Woke};
pub(crate) use table::{Begin, Core, Handback, InFlightGuard, Unanswered, WatchEntry};

pub use handover::{DEFAULT_HANDOVER_LIMIT, DEFAULT_HANDOVER_WINDOW};
