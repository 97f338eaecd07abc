//! The async shell: it carries out what `policy` decides for a call (attempt, sleep,
//! hand-over, release) with IO, over the client's state in `state` and the Redis side in
//! `wire`. Acquire, release, the line's part of a call, the watchdog, and the waiting
//! loop of the semaphores and the latch.

pub(crate) mod acquire;
pub(crate) mod attempt;
pub(crate) mod held;
pub(crate) mod inflight;
pub(crate) mod release;
pub(crate) mod services;
pub(crate) mod sync_wait;
pub(crate) mod target;
pub(crate) mod watchdog;
