//! The public API: the client, its builder, the handles a caller asks for (`Lock`,
//! `ReadWriteLock`, the semaphores, the latch, `MultiLock`, `RedLock`) and the guards they
//! return. A call enters here and goes down into `shell`; nothing below imports this
//! folder, except the shell's guard constructors, which build the guards defined here.

pub(crate) mod builder;
pub(crate) mod client;
pub(crate) mod guard;
pub(crate) mod latch;
pub(crate) mod lock;
pub(crate) mod multi;
pub(crate) mod permit_guard;
pub(crate) mod permits;
pub(crate) mod query;
pub(crate) mod rw_lock;
pub(crate) mod semaphore;
pub(crate) mod semaphore_permit;

#[cfg(feature = "blocking")]
pub mod blocking;
