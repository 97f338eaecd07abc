//! The public API: the client, its builder, the handles a caller asks for (`Lock`,
//! `ReadWriteLock`, the semaphores, the latch, `MultiLock`, `RedLock`) and the guards they
//! return. A call enters here and goes down into `shell` (and to `state` and `wire`
//! directly where no waiting is involved); nothing below imports this folder: the shell
//! hands a hold back as a `shell::held::Held`, which `guard.rs` wraps in a `LockGuard`.

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
